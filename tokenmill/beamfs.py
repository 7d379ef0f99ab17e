"""Beam's FileSystems, as every tokenmill module that reads or writes through Beam imports it:
with Beam's S3 filesystem patched first (store.patch_beam: one client per process, small files
as one PutObject), in the launcher and in every worker that unpickles a tokenmill step."""

from apache_beam.io.filesystems import CompressionTypes, FileSystems

from tokenmill import store

store.patch_beam()

__all__ = ["CompressionTypes", "FileSystems"]
