"""Object stores (s3://, gs://) beside local paths: one client per process (S3, GCS), the
operations the output's commit protocol needs (S3Store, GCSStore), and an object read as a file
with one request (ObjectReader). Credentials: tokenmill/credentials.py; Beam's own filesystems,
made fit for many small files: tokenmill/beamfs.py; the local cache: tokenmill/store_cache.py.

Nothing here imports Beam or boto3 at module load: the trainer imports this module too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from tokenmill.credentials import FLAG_ENV, describe
from tokenmill.errors import UserError

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


def is_store(path: str) -> bool:
    """A path on an object store tokenmill writes to (the commit protocol's: pipelines/commit.py)."""
    return path.startswith(("s3://", "gs://"))


def committed(out: str) -> tuple[bytes | None, dict | None]:
    """OUT's manifest on a store, the commit point: its bytes and its JSON object ((None, None)
    where there is none; (bytes, None) where it is no JSON object)."""
    raw = Store(out).read(out.rstrip("/") + "/manifest.json")
    if raw is None:
        return None, None
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        manifest = json.loads(raw.decode("utf-8"))
        return raw, manifest if isinstance(manifest, dict) else None
    return raw, None


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

    def _reader(self, url: str):
        """The object's bytes as a stream (closed by the caller)."""
        return self.c.get_object(Bucket=self.bucket, Key=self._key(url))["Body"]

    def sha256(self, url: str) -> str:
        h = hashlib.sha256()
        with contextlib.closing(self._reader(url)) as src:
            for chunk in iter(lambda: src.read(1 << 22), b""):
                h.update(chunk)
        return h.hexdigest()

    def download(self, url: str, local: str) -> str:
        """``url`` to the local file ``local`` (written whole or not at all); returns its sha256."""
        tmp = f"{local}.part-{os.getpid()}"
        h = hashlib.sha256()
        try:
            with contextlib.closing(self._reader(url)) as src, open(tmp, "wb") as fh:
                for chunk in iter(lambda: src.read(1 << 22), b""):
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


def _status(e: BaseException) -> int | None:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def parallel(fn, items: list) -> list:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(fn, items))


