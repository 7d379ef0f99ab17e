"""Object stores (s3://, gs://) beside local paths: one client per process, Beam's S3 filesystem
made fit for many small files, the operations the output's commit protocol needs, the secrets
kept out of every line, and a verified local cache for what must be a local file (the trainer's
memory-mapped shards).

Credentials and the endpoint come from the usual places: the AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), ``~/.aws``, or Beam's ``--s3_*`` flags, which
``absorb_flags`` moves into this process's environment so that every local worker inherits them
(a remote runner's workers get them through the job, as Beam sends every option). ``gs://`` goes
through Beam's GCS filesystem (google-cloud-storage; ``STORAGE_EMULATOR_HOST`` for an emulator).

Nothing here imports Beam or boto3 at module load: the trainer imports this module too.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib
import io
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from tokenmill.errors import UserError

# Beam's flag -> the environment variable boto3 reads. The secret ones are never printed.
FLAG_ENV = {"s3_access_key_id": "AWS_ACCESS_KEY_ID", "s3_secret_access_key": "AWS_SECRET_ACCESS_KEY",
            "s3_session_token": "AWS_SESSION_TOKEN", "s3_endpoint_url": "AWS_ENDPOINT_URL",
            "s3_region_name": "AWS_REGION"}
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GOOGLE_OAUTH_ACCESS_TOKEN")
# Bounded retries with backoff (botocore's "standard" mode: exponential, jittered, throttling
# errors included): a throttling store slows a run down, a dead one ends it within ~a minute.
RETRIES = 6
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
PARALLEL = 16  # requests in flight for listings' follow-ups, deletes, uploads, hashes


def remote(path: str) -> bool:
    return "://" in path


def split_url(url: str) -> tuple[str, str, str]:
    """``s3://bucket/key`` -> ("s3", "bucket", "key")."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    return scheme, bucket, key


# ---------------------------------------------------------------- secrets


def absorb_flags(beam_args: list[str], keep: bool) -> list[str]:
    """Beam's ``--s3_*`` flags into this process's environment (boto3 reads it; local workers
    inherit it), returned without them unless ``keep`` (a remote runner's workers need them in
    the job's options). Must run before any worker process starts."""
    rest = []
    it = iter(range(len(beam_args)))
    for i in it:
        arg = beam_args[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in FLAG_ENV:
            if not eq and i + 1 < len(beam_args):
                value = beam_args[i + 1]
                next(it, None)
                if keep:
                    rest += [arg, value]
            elif keep:
                rest.append(arg)
            os.environ[FLAG_ENV[name]] = value
            continue
        rest.append(arg)
    return rest


# Runners whose workers are this machine's processes, started by this one (they inherit its
# environment): Beam's --s3_* flags reach them through it, never through a command line.
LOCAL_RUNNERS = ("", "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner", "PrismRunner")


def store_flags(args: list[str], beam: bool = True) -> list[str]:
    """A verb's extra arguments with Beam's --s3_* flags taken into the environment
    (absorb_flags): kept in the job's options only for a remote runner's job (``beam``)."""
    runner = ""
    for i, a in enumerate(args):
        if a.startswith("--runner="):
            runner = a.split("=", 1)[1]
        elif a == "--runner" and i + 1 < len(args):
            runner = args[i + 1]
    return absorb_flags(args, keep=beam and runner.rsplit(".", 1)[-1] not in LOCAL_RUNNERS)


def secrets() -> list[str]:
    """Every secret this process knows of, longest first (a key inside another is still hidden)."""
    found = {os.environ.get(k, "") for k in SECRET_ENV}
    return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


def redact(text: str) -> str:
    for s in secrets():
        text = text.replace(s, "***")
    return text


def describe(e: BaseException) -> str:
    """A store error in one line: the service's code and message, no request ids or secrets."""
    response = getattr(e, "response", None)
    if isinstance(response, dict) and isinstance(response.get("Error"), dict):
        err = response["Error"]
        text = f"{err.get('Code', type(e).__name__)}: {err.get('Message', '')}".rstrip(": ")
    else:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return redact(re.sub(r"\s+", " ", text))[:300]


# ---------------------------------------------------------------- one S3 client per process

_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def s3_client(endpoint: str | None = None, key_id: str | None = None, secret: str | None = None,
              token: str | None = None, region: str | None = None, verify=None, use_ssl: bool = True):
    """boto3's S3 client for these settings (None: boto3's own lookup: environment, ~/.aws), made
    once per process and shared by every thread (boto3 clients are thread-safe). Beam made one per
    filesystem call: ~180 ms each here, most of a small job's time on a store."""
    ident = (os.getpid(), endpoint, key_id, secret, token, region, verify, use_ssl,
             tuple(os.environ.get(k) for k in FLAG_ENV.values()))
    with _clients_lock:
        client = _clients.get(ident)
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise UserError("s3:// paths need boto3: pip install 'tokenmill[s3]'") from None
            config = Config(retries={"max_attempts": RETRIES, "mode": "standard"},
                            connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                            max_pool_connections=2 * PARALLEL)
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
                aws_session_token=token, region_name=region, verify=verify, use_ssl=use_ssl, config=config)
            _clients[ident] = client
        return client


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

    def get_filesystem_loading_gcs(path):  # Beam's GCS filesystem, loaded with the first gs:// path
        if path.startswith("gs://") and "apache_beam.io.gcp.gcsfilesystem" not in sys.modules:
            import warnings

            with warnings.catch_warnings():  # google-auth's notices about grpcio and Python versions
                warnings.simplefilter("ignore", FutureWarning)
                with contextlib.suppress(ImportError):
                    importlib.import_module("apache_beam.io.gcp.gcsfilesystem")
                    _patch_gcsio()
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
            self._chunks.append(data.tobytes())
            self._buffered += len(self._chunks[-1])
            if self._buffered >= self.MIN_PART:
                if self.upload_id is None:
                    s3io.S3Uploader._start_upload(self)
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
    no object, no unfinished upload). Other filesystems: closed as usual."""
    uploader = getattr(getattr(fh, "raw", None), "_uploader", None)
    if uploader is not None and hasattr(uploader, "abort"):
        uploader.abort()
    with contextlib.suppress(Exception):
        fh.close()


# ---------------------------------------------------------------- the operations OUT needs


def _one_line(cls):
    """Every public operation of a store class fails as one UserError line naming the store, the
    operation and the service's own words (after the client's bounded retries), not a traceback.
    A missing object stays FileNotFoundError (readers count it)."""

    def wrap(name, method):
        @functools.wraps(method)
        def op(self, *args, **kw):
            try:
                return method(self, *args, **kw)
            except (UserError, FileNotFoundError):
                raise
            except Exception as e:  # noqa: BLE001
                where = args[0] if args and isinstance(args[0], str) else f"{self.scheme}://{self.bucket}"
                raise UserError(f"{where}: {name} failed on the object store ({describe(e)})") from None
        return op

    for name, method in list(vars(cls).items()):
        if callable(method) and not name.startswith("_"):
            setattr(cls, name, wrap(name, method))
    return cls


def Store(url: str):  # noqa: N802 - reads as the class it returns
    """The store ``url`` is on: S3Store or GCSStore."""
    scheme = split_url(url)[0]
    if scheme == "s3":
        return S3Store(url)
    if scheme == "gs":
        return GCSStore(url)
    raise UserError(f"{url}: not an object store tokenmill writes to (s3://, gs://, or a local path)")


@_one_line
class S3Store:
    """What the output's commit protocol does on an object store, in as few requests as the API
    allows: listings of a prefix, conditional writes, batch deletes, unfinished uploads."""

    def __init__(self, url: str):
        self.scheme, self.bucket, _ = split_url(url)
        self.c = s3_client()

    def _key(self, url: str) -> str:
        return split_url(url)[2]

    def _url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def _prefix(self, url: str) -> str:
        """The key prefix of everything under ``url`` as a folder ("" for a bucket's root)."""
        key = self._key(url).strip("/")
        return f"{key}/" if key else ""

    def list(self, prefix_url: str) -> dict[str, int]:
        """Every object under ``prefix_url`` (a folder: a trailing / is added): url -> size."""
        prefix = self._prefix(prefix_url)
        found: dict[str, int] = {}
        for page in self.c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                found[self._url(obj["Key"])] = obj["Size"]
        return found

    def folders(self, prefix_url: str) -> list[str]:
        """The names of the 'folders' right under ``prefix_url``."""
        prefix = self._prefix(prefix_url)
        names = []
        for page in self.c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            names += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return names

    def read(self, url: str) -> bytes | None:
        try:
            return self.c.get_object(Bucket=self.bucket, Key=self._key(url))["Body"].read()
        except self.c.exceptions.NoSuchKey:
            return None

    def head(self, url: str) -> str | None:
        """The object's ETag, or None where there is none."""
        try:
            return self.c.head_object(Bucket=self.bucket, Key=self._key(url))["ETag"]
        except Exception as e:  # noqa: BLE001
            if _status(e) == 404:
                return None
            raise

    def write(self, url: str, data: bytes, if_absent: bool = False, if_match: str | None = None) -> str | None:
        """PutObject; with ``if_absent`` or ``if_match`` a conditional one, None when refused
        (someone else's object is there, or it changed). Returns the new ETag."""
        kw = {}
        if if_absent:
            kw["IfNoneMatch"] = "*"
        if if_match is not None:
            kw["IfMatch"] = if_match
        try:
            return self.c.put_object(Bucket=self.bucket, Key=self._key(url), Body=data, **kw)["ETag"]
        except Exception as e:  # noqa: BLE001
            if _status(e) in (409, 412) and kw:
                return None
            raise

    def delete(self, urls: Iterable[str]) -> None:
        keys = [self._key(u) for u in urls]
        batches = [keys[i:i + 1000] for i in range(0, len(keys), 1000)]

        def one(batch):
            self.c.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})

        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(one, batches))

    def uploads(self, prefix_url: str) -> list[tuple[str, str]]:
        """Unfinished multipart uploads under ``prefix_url`` (listings do not show them, and they
        are billed): (url, upload id)."""
        prefix = self._prefix(prefix_url)
        found = []
        for page in self.c.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
            found += [(self._url(u["Key"]), u["UploadId"]) for u in page.get("Uploads", [])]
        return found

    def abort_uploads(self, prefix_url: str) -> int:
        found = self.uploads(prefix_url)
        for url, upload_id in found:
            with contextlib.suppress(Exception):
                self.c.abort_multipart_upload(Bucket=self.bucket, Key=self._key(url), UploadId=upload_id)
        return len(found)

    def sha256(self, url: str) -> str:
        body = self.c.get_object(Bucket=self.bucket, Key=self._key(url))["Body"]
        h = hashlib.sha256()
        for chunk in iter(lambda: body.read(1 << 22), b""):
            h.update(chunk)
        return h.hexdigest()

    def download(self, url: str, local: str) -> str:
        """``url`` to the local file ``local`` (written whole or not at all); returns its sha256."""
        tmp = f"{local}.part-{os.getpid()}"
        h = hashlib.sha256()
        try:
            body = self.c.get_object(Bucket=self.bucket, Key=self._key(url))["Body"]
            with open(tmp, "wb") as fh:
                for chunk in iter(lambda: body.read(1 << 22), b""):
                    h.update(chunk)
                    fh.write(chunk)
            os.replace(tmp, local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return h.hexdigest()


class ObjectReader(io.RawIOBase):
    """An object read as a file: one streaming GetObject from the current position, opened on
    the first read (Beam's reader asks HeadObject, then GetObject, and buffers 16 MB a file); a
    seek drops the stream and the next read asks again from there. A missing object raises
    FileNotFoundError when first read."""

    def __init__(self, url: str):
        super().__init__()
        self.url, self._st = url, S3Store(url)
        self._pos, self._size, self._body = 0, None, None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _open(self) -> bool:
        kw = {"Range": f"bytes={self._pos}-"} if self._pos else {}
        try:
            response = self._st.c.get_object(Bucket=self._st.bucket, Key=self._st._key(self.url), **kw)
        except Exception as e:  # noqa: BLE001
            status = _status(e)
            if status == 404:
                raise FileNotFoundError(f"Not found: {self.url}") from None
            if status == 416:  # at or past the end
                return False
            raise
        self._size = self._pos + response["ContentLength"]
        self._body = response["Body"]
        return True

    def readinto(self, b) -> int:
        if self._body is None and (self._size is not None and self._pos >= self._size or not self._open()):
            return 0
        data = self._body.read(len(b))
        n = len(data)
        b[:n] = data
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            if self._size is None:
                self._size = self._st.c.head_object(Bucket=self._st.bucket, Key=self._st._key(self.url))["ContentLength"]
            offset += self._size
        elif whence == io.SEEK_CUR:
            offset += self._pos
        if offset != self._pos:
            self._drop()
            self._pos = max(0, offset)
        return self._pos

    def _drop(self) -> None:
        if self._body is not None:
            with contextlib.suppress(Exception):
                self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop()
        super().close()


def open_object(url: str, buffer_size: int = 1 << 20) -> io.BufferedReader:
    return io.BufferedReader(ObjectReader(url), buffer_size=buffer_size)


_gcs_clients: dict[tuple, object] = {}


def gcs_client(credentials=None, project: str | None = None):
    """google-cloud-storage's client, one per process (thread-safe): with the environment's
    credentials, or anonymous for an emulator (STORAGE_EMULATOR_HOST), whose address the client
    reads itself."""
    ident = (os.getpid(), id(credentials), project, os.environ.get("STORAGE_EMULATOR_HOST"))
    with _clients_lock:
        client = _gcs_clients.get(ident)
        if client is None:
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    from google.cloud import storage
            except ImportError:
                raise UserError("gs:// paths need google-cloud-storage: pip install 'tokenmill[gcs]'") from None
            if os.environ.get("STORAGE_EMULATOR_HOST"):
                client = storage.Client.create_anonymous_client()
            elif credentials is not None:
                client = storage.Client(credentials=credentials, project=project)
            else:
                client = storage.Client(project=project)
            _gcs_clients[ident] = client
        return client


@_one_line
class GCSStore(S3Store):
    """The same operations on Google Cloud Storage: conditional writes by generation
    (``if_generation_match``: 0 for "absent"), the object's generation as its ETag. GCS keeps no
    listable unfinished uploads (an unfinished resumable upload expires within a week)."""

    def __init__(self, url: str):
        self.scheme, self.bucket, _ = split_url(url)
        self.gcs = gcs_client()
        self.b = self.gcs.bucket(self.bucket)

    def list(self, prefix_url: str) -> dict[str, int]:
        prefix = self._prefix(prefix_url)
        return {self._url(b.name): b.size for b in self.gcs.list_blobs(self.bucket, prefix=prefix)}

    def folders(self, prefix_url: str) -> list[str]:
        prefix = self._prefix(prefix_url)
        it = self.gcs.list_blobs(self.bucket, prefix=prefix, delimiter="/")
        for _ in it:  # the prefixes are known once the pages are read
            pass
        return sorted(p[len(prefix):].rstrip("/") for p in it.prefixes)

    def read(self, url: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self.b.blob(self._key(url)).download_as_bytes()
        except NotFound:
            return None

    def head(self, url: str) -> str | None:
        blob = self.b.get_blob(self._key(url))
        return None if blob is None else str(blob.generation)

    def write(self, url: str, data: bytes, if_absent: bool = False, if_match: str | None = None) -> str | None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self.b.blob(self._key(url))
        kw = {"if_generation_match": 0} if if_absent else {"if_generation_match": int(if_match)} if if_match else {}
        try:
            blob.upload_from_string(data, **kw)
        except PreconditionFailed:
            return None
        return str(blob.generation)

    def delete(self, urls: Iterable[str]) -> None:
        from google.api_core.exceptions import NotFound

        def one(url):
            with contextlib.suppress(NotFound):
                self.b.blob(self._key(url)).delete()

        parallel(one, list(urls))

    def uploads(self, prefix_url: str) -> list[tuple[str, str]]:
        return []

    def _reader(self, url: str):
        from google.api_core.exceptions import NotFound

        try:
            return self.b.blob(self._key(url)).open("rb", chunk_size=1 << 22)
        except NotFound:
            raise FileNotFoundError(f"Not found: {url}") from None

    def sha256(self, url: str) -> str:
        h = hashlib.sha256()
        with self._reader(url) as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        return h.hexdigest()

    def download(self, url: str, local: str) -> str:
        tmp = f"{local}.part-{os.getpid()}"
        h = hashlib.sha256()
        try:
            with self._reader(url) as src, open(tmp, "wb") as fh:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    h.update(chunk)
                    fh.write(chunk)
            os.replace(tmp, local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return h.hexdigest()


def _status(e: BaseException) -> int | None:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def parallel(fn, items: list) -> list:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(fn, items))


# ---------------------------------------------------------------- a verified local cache


def cache_dir() -> str:
    return os.environ.get("TOKENMILL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tokenmill", "objects")


def cache_limit() -> int:
    """Bytes the cache may hold (TOKENMILL_CACHE_GB, default 50): older entries not in use by
    this process are removed to make room."""
    return int(float(os.environ.get("TOKENMILL_CACHE_GB", "50")) * 2**30)


@contextlib.contextmanager
def _cache_locked(folder: str, name: str) -> Iterator[None]:
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f"{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cached(url: str, sha256: str, size: int, keep: Iterable[str] = ()) -> str:
    """A local copy of ``url`` whose sha256 is ``sha256``: from the cache (named by the hash, so
    a changed object is never mistaken for the old one), or downloaded and checked first. Ranks
    on one host share it (a file lock: one download per file per host). ``keep``: the hashes
    this process needs too, never evicted to make room."""
    folder = cache_dir()
    local = os.path.join(folder, sha256)
    if os.path.exists(local):
        os.utime(local)
        return local
    with _cache_locked(folder, sha256):
        if os.path.exists(local):
            return local
        _make_room(folder, size, {sha256, *keep})
        got = Store(url).download(url, local + ".new")
        if got != sha256:
            os.unlink(local + ".new")
            raise UserError(f"{url}: sha256 {got[:12]}... does not match the manifest ({sha256[:12]}...)")
        os.replace(local + ".new", local)
    return local


def _make_room(folder: str, size: int, keep: set[str]) -> None:
    entries = []
    for name in os.listdir(folder):
        if len(name) == 64 and name not in keep:
            st = os.stat(os.path.join(folder, name))
            entries.append((st.st_mtime, name, st.st_size))
    total = sum(e[2] for e in entries)
    for _, name, n in sorted(entries):
        if total + size <= cache_limit():
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
        total -= n


def now() -> float:
    return time.time()
