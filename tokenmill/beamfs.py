"""Beam's FileSystems, as every tokenmill module that reads or writes through Beam imports it:
with Beam's S3 filesystem patched first (store.patch_beam: one client per process, small files
as one PutObject), in the launcher and in every worker that unpickles a tokenmill step.

Imported without Beam's modules that load Google's libraries (beamload.GOOGLE): its GCS filesystem
(google-cloud-storage: ~0.5 s to import, and FutureWarnings on stderr) is loaded only when a
gs:// path is first used (store.patch_beam), not by every command."""

from tokenmill import store
from tokenmill.pipelines.beamload import GOOGLE, without_optional

with without_optional(GOOGLE):
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

store.patch_beam()

__all__ = ["CompressionTypes", "FileSystems"]
