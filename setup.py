"""The compiled parts of the HTML extractor (tokenmill/transforms/extract/):

* ``accelerated``: the walk over lxml's tree and the attribute-cap sweep, against lxml's headers;
* ``lexbor_walk``: the walk over lexbor's tree (selectolax's parser, the fast path), against the
  lexbor headers of the very selectolax release installed (they are not in its wheel: they come
  from its source archive on the package index, checked against the index's sha256, or from
  $TOKENMILL_LEXBOR_INCLUDE).

Both optional: where one cannot be built (no C compiler, no headers), the install goes on and the
extractor runs their Python twins (walk.py's py_walk, lexbor_py.py), which give the same bytes,
slower. Everything else is in pyproject.toml."""

import hashlib
import os
import re
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

import lxml
import selectolax
from Cython.Build import cythonize
from setuptools import Extension, setup


def lexbor_include() -> str | None:
    given = os.environ.get("TOKENMILL_LEXBOR_INCLUDE")
    if given:
        return given
    version = selectolax.__version__
    include = Path("build") / f"lexbor-{version}"
    if not (include / "lexbor" / "html" / "html.h").exists():
        try:
            index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/selectolax/"
            with urllib.request.urlopen(index, timeout=60) as r:
                page = r.read().decode()
            name = f"selectolax-{version}.tar.gz"
            href, sha256 = re.search(rf'href="([^"]*/{re.escape(name)})#sha256=([0-9a-f]+)"', page).groups()
            with urllib.request.urlopen(urllib.parse.urljoin(index, href), timeout=300) as r:
                data = r.read()
            if hashlib.sha256(data).hexdigest() != sha256:
                raise OSError("sha256 mismatch")
            archive = include.with_suffix(".tar.gz")
            archive.parent.mkdir(parents=True, exist_ok=True)
            archive.write_bytes(data)
            with tarfile.open(archive) as tar:
                for m in tar.getmembers():
                    parts = m.name.split("/")
                    if m.isfile() and parts[1:3] == ["lexbor", "source"] and m.name.endswith(".h"):
                        m.name = "/".join(parts[3:])
                        tar.extract(m, include, filter="data")
            archive.unlink()
        except (OSError, AttributeError, ValueError) as exc:  # AttributeError: no such file listed
            print(f"tokenmill: lexbor headers for selectolax {version} not found ({exc}); "
                  "the extractor will walk lexbor's tree in Python (the same text, slower)", file=sys.stderr)
            return None
    return str(include)


extract = "tokenmill/transforms/extract"
extensions = [Extension("tokenmill.transforms.extract.accelerated", [f"{extract}/accelerated.pyx"],
                        include_dirs=lxml.get_include(), optional=True)]
lexbor = lexbor_include()
if lexbor:
    extensions.append(Extension("tokenmill.transforms.extract.lexbor_walk", [f"{extract}/lexbor_walk.pyx"],
                                include_dirs=[lexbor], optional=True))
setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": 3}, quiet=True,
                            include_path=[str(Path(selectolax.__file__).parent.parent)]))
