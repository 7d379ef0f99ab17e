"""The compiled twins of the HTML extractor's hottest steps (tokenmill/transforms/extract/
accelerated.pyx: the tree walk and the attribute-cap sweep), built against lxml's headers.
Optional: where they cannot be built (no C compiler), the install goes on and the extractor
runs its Python steps, with the same output. Everything else is in pyproject.toml."""

import lxml
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("tokenmill.transforms.extract.accelerated", ["tokenmill/transforms/extract/accelerated.pyx"],
               include_dirs=lxml.get_include(), optional=True)],
    compiler_directives={"language_level": 3}, quiet=True))
