"""The wheel's build step that ships the committed stores of the cache inside the package, packed.

``pyproject.toml`` names ``BuildPy`` as setuptools' ``build_py``: after the modules, each store
under ``tuning_logs/`` is written to ``relaxc/tuning_logs/`` in the build, its database files
gzipped (``support/store_files.py``: 291 MB of JSON become about 15 MB), where
``relaxc.schedules.cache.shipped_root`` finds them. An editable install reads the checkout's
``tuning_logs/`` instead and packs nothing.
"""

import importlib.util
import os

from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _store_files():
    """``support/store_files.py`` by its path: importing ``relaxc`` needs TVM, which a build lacks."""
    spec = importlib.util.spec_from_file_location("relaxc_store_files", os.path.join(ROOT, "support", "store_files.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        source = os.path.join(ROOT, "tuning_logs")
        if not os.path.isdir(source):
            raise RuntimeError(f"{source} is missing: the wheel ships the committed stores of the cache")
        store_files = _store_files()
        for key in sorted(os.listdir(source)):
            if os.path.isdir(os.path.join(source, key)):
                store_files.pack_store(os.path.join(source, key), os.path.join(self.build_lib, "relaxc", "tuning_logs", key))
