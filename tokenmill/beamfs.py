"""Beam's FileSystems, as every tokenmill module that reads or writes through Beam imports it:
with Beam's S3 filesystem patched first (patch_beam: one client per process, small files
as one PutObject), in the launcher and in every worker that unpickles a tokenmill step.

Imported without Beam's modules that load Google's libraries (beamload.GOOGLE): its GCS filesystem
(google-cloud-storage: ~0.5 s to import, and FutureWarnings on stderr) is loaded only when a
gs:// path is first used (patch_beam), not by every command."""

import contextlib
import importlib
import os
import sys
import threading
from types import SimpleNamespace

from tokenmill.pipelines.beamload import GOOGLE, without_optional
from tokenmill.store import gcs_client, s3_client

with without_optional(GOOGLE):
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

__all__ = ["CompressionTypes", "FileSystems", "abort_write"]


_patched = False


def patch_beam() -> None:
    """Beam's S3 filesystem, made fit for a job of many files (apache-beam 2.62):
    - one boto3 client per process and settings, instead of one per call;
    - a file under 5 MB is one PutObject when closed, not a multipart upload: an empty file can be
      written (S3 refuses a multipart upload of no part, Beam's way), a small one costs one request
      instead of three, and a worker killed while writing it leaves no unfinished upload behind;
    - a bigger file still goes up in 5 MB parts; an abandoned one aborts its upload.
    - one layer of bounded retries (botocore's), not Beam's backoff around it as well;
    - a process that runs no pipeline (inspect, export, report) reads the environment's settings
      instead of failing for want of pipeline options.
    And Beam's GCS filesystem: one storage client per process (Beam made one per call), and an
    anonymous one where STORAGE_EMULATOR_HOST names an emulator (Beam first spent ~20 s looking
    for credentials there).
    Idempotent; each part a no-op without its library."""
    global _patched
    if _patched:
        return
    _patched = True
    _patch_gcs()
    _patch_s3()


def _patch_gcs() -> None:
    from apache_beam.io.filesystems import FileSystems

    get_filesystem = FileSystems.get_filesystem
    loaded = threading.Event()  # set once the import has finished (or failed): sys.modules holds a
    lock = threading.Lock()     # module from the start of its import, which another thread would take for done

    def get_filesystem_loading_gcs(path):  # Beam's GCS filesystem, loaded with the first gs:// path
        if path.startswith("gs://") and not loaded.is_set():
            with lock:
                if not loaded.is_set():
                    import warnings

                    with warnings.catch_warnings():  # google-auth's notices about grpcio and Python versions
                        warnings.simplefilter("ignore", FutureWarning)
                        with contextlib.suppress(ImportError):
                            importlib.import_module("apache_beam.io.gcp.gcsfilesystem")
                            _patch_gcsio()
                    loaded.set()
        return get_filesystem(path)

    FileSystems.get_filesystem = staticmethod(get_filesystem_loading_gcs)
    if "apache_beam.io.gcp.gcsfilesystem" in sys.modules:
        _patch_gcsio()


def _patch_gcsio() -> None:
    try:
        from apache_beam.io.gcp import gcsio
    except ImportError:
        return
    if getattr(gcsio.create_storage_client, "tokenmill", False):
        return
    made = gcsio.create_storage_client
    cache: dict[tuple, object] = {}

    def create_storage_client(pipeline_options, use_credentials=True):
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            return gcs_client()
        ident = (os.getpid(), use_credentials)
        if ident not in cache:
            cache[ident] = made(pipeline_options, use_credentials)
        return cache[ident]

    create_storage_client.tokenmill = True
    gcsio.create_storage_client = create_storage_client


def _patch_s3() -> None:
    try:
        from apache_beam.io.aws import s3io
        from apache_beam.io.aws.clients.s3 import boto3_client
        from apache_beam.options import pipeline_options
    except ImportError:
        return
    if not getattr(s3io, "BOTO3_INSTALLED", False):
        return

    def client_init(self, options):
        if isinstance(options, pipeline_options.PipelineOptions):
            o = options.view_as(pipeline_options.S3Options)
            get = lambda name: getattr(o, name, None)  # noqa: E731
        else:
            get = (options or {}).get
        self.client = s3_client(get("s3_endpoint_url"), get("s3_access_key_id"), get("s3_secret_access_key"),
                                get("s3_session_token"), get("s3_region_name"), get("s3_verify"),
                                not get("s3_disable_ssl"))
        self._download_request = None
        self._download_stream = None
        self._download_pos = 0

    boto3_client.Client.__init__ = client_init
    # botocore retries every request itself, with jittered backoff, RETRIES times; Beam's own
    # backoff on top (7 more tries from 5 s, doubling, around each of those) kept a run whose
    # store went away waiting ~10 minutes before its error. One layer of retries, bounded.
    from apache_beam.utils import retry

    for cls, name in ((s3io.S3IO, "copy"), (s3io.S3IO, "delete"), (s3io.S3IO, "_delete_minibatch"),
                      (s3io.S3IO, "_s3_object"), (s3io.S3Downloader, "_get_object_metadata")):
        method = getattr(cls, name, None)
        if method is not None and hasattr(method, "__wrapped__"):
            setattr(cls, name, method.__wrapped__)
    s3io.retry = SimpleNamespace(**{**vars(retry), "with_exponential_backoff": lambda **kw: (lambda fn: fn)})
    io_init = s3io.S3IO.__init__

    def s3io_init(self, client=None, options=None):  # no pipeline options (a verb outside a job): the environment's
        io_init(self, client, {} if client is None and options is None else options)

    s3io.S3IO.__init__ = s3io_init

    class Uploader(s3io.S3Uploader):
        MIN_PART = 5 * 1024 * 1024

        def __init__(self, client, path, mime_type="application/octet-stream"):
            self._chunks: list[bytes] = []
            self._buffered = 0
            self.aborted = False
            super().__init__(client, path, mime_type)

        def _start_upload(self):  # deferred until a part is due (see put)
            pass

        def put(self, data):
            if self.aborted:  # (the close after abort_write flushes Beam's buffer here: no upload for it)
                return
            self._chunks.append(data.tobytes())
            self._buffered += len(self._chunks[-1])
            if self._buffered >= self.MIN_PART:
                if self.upload_id is None:
                    super()._start_upload()  # Beam's (s3io.S3Uploader is this class now)
                self._write_to_s3(b"".join(self._chunks))
                self._chunks, self._buffered = [], 0

        def finish(self):
            if self.aborted:
                return
            body = b"".join(self._chunks)
            self._chunks, self._buffered = [], 0
            if self.upload_id is None:
                self._client.client.put_object(Bucket=self._bucket, Key=self._name, Body=body,
                                               ContentType=self._mime_type)
                return
            self.buffer = body
            super().finish()

        def abort(self):
            self.aborted = True
            if self.upload_id is not None:
                with contextlib.suppress(Exception):
                    self._client.client.abort_multipart_upload(Bucket=self._bucket, Key=self._name,
                                                               UploadId=self.upload_id)

    s3io.S3Uploader = Uploader



def abort_write(fh) -> None:
    """Drop a file opened for writing through Beam without making it (an S3 upload is aborted:
    no object, no unfinished upload; a GCS one never finished). Other filesystems: closed as usual."""
    uploader = getattr(getattr(fh, "raw", None), "_uploader", None)
    if uploader is not None and hasattr(uploader, "abort"):
        uploader.abort()
    if any(c.__name__ == "BlobWriter" for c in type(fh).__mro__):
        # google-cloud-storage's writer (Beam's gs:// files) finishes the upload when closed, and
        # IOBase closes it when collected: its buffer closed first, it never does. (A resumable
        # session already begun, past 16 MB, is left unfinished: GCS drops it after a week.)
        with contextlib.suppress(Exception):
            fh._buffer.close()
    with contextlib.suppress(Exception):
        fh.close()


patch_beam()
