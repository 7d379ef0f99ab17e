"""The compiled walk of the HTML extractor (tokenmill/transforms/extract/_compiled.pyx), built
against lxml's headers. Optional: where it cannot be built (no C compiler), the install goes
on and the extractor runs its Python walk, with the same output. Everything else is in
pyproject.toml."""

import lxml
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("tokenmill.transforms.extract._compiled", ["tokenmill/transforms/extract/_compiled.pyx"],
               include_dirs=lxml.get_include(), optional=True)],
    compiler_directives={"language_level": 3}, quiet=True))
