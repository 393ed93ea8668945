"""The build backend: setuptools' own, less one notice.

The repository's top-level folders map onto ``eclectus.*`` subpackages (pyproject's
``package-dir``), so an editable install always goes through setuptools' import finder, and
setuptools then prints an ``InformationOnly`` "Editable installation." notice as a warning on
every ``pip install -e .``. Nothing is wrong, so it is filtered here; every other setuptools
warning still shows.
"""

import warnings

from setuptools.build_meta import *  # noqa: F403  (the PEP 517 hooks, unchanged)
from setuptools.warnings import InformationOnly

warnings.filterwarnings("ignore", category=InformationOnly)
