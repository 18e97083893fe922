"""Build hook: the hot modules compiled ahead of time with mypyc, where that can be done.

Everything else about the package is in pyproject.toml. The modules below carry every
message (the STOMP codec, the gateway's session, the engines, the rings, flow accounting,
the pipeline workers' loop); they are strictly typed, and mypyc turns them into C
extensions that run the same code with fewer interpreter steps (docs/benchmarks.md,
"Compiled modules", has the measurements). The pure-Python modules stay in the package
and serve wherever the compiled ones are missing, so the build never depends on it:

- a wheel or a plain ``pip install .`` compiles them when a C compiler is there, and
  builds a pure package (saying so) when compiling fails;
- an editable install (``pip install -e .``, what ops/run.sh and ops/test.sh make) stays
  pure Python: a compiled module in the source tree would shadow later edits of its
  ``.py`` file. ``MPBROKER_COMPILE=1`` compiles in place anyway (to measure; rebuild
  after every edit, or delete the ``.so`` files);
- ``MPBROKER_PURE=1`` never compiles.

``mpbroker --version`` says which kind a process runs, and the broker logs it at start.
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: mpbroker/native.py lists them (and what mypyc needs of them); read as a file, since the
#: package cannot be imported before it is built.
HOT_MODULES = [
    name.replace(".", "/") + ".py"
    for name in runpy.run_path(str(Path(__file__).parent / "mpbroker" / "native.py"))["HOT_MODULES"]
]


def _say(text: str) -> None:
    print(f"mpbroker build: {text}", file=sys.stderr, flush=True)


class BuildHotModules(build_ext):
    """build_ext that compiles `HOT_MODULES` with mypyc, or nothing (see the module doc)."""

    def run(self) -> None:
        if os.environ.get("MPBROKER_PURE") == "1":
            _say("MPBROKER_PURE=1: pure-Python modules only")
            self._pure()
            return
        if getattr(self, "editable_mode", False) and os.environ.get("MPBROKER_COMPILE") != "1":
            _say("editable install: pure-Python modules (MPBROKER_COMPILE=1 compiles them)")
            self._pure()
            return
        try:
            self.extensions = _compiled_extensions()
            self.check_extensions_list(self.extensions)
            for extension in self.extensions:
                # What finalize_options sets on the extensions it was given.
                extension._full_name = self.get_ext_fullname(extension.name)  # type: ignore[attr-defined]
                extension._links_to_dynamic = False  # type: ignore[attr-defined]
                extension._needs_stub = False  # type: ignore[attr-defined]
            super().run()
        except (Exception, SystemExit) as exc:  # mypyc exits on a type error
            reason = f"{type(exc).__name__}: {exc}"[:300]
            _say(f"compiling the hot modules failed, pure-Python modules only ({reason})")
            self._pure()
            return
        _say(f"compiled {len(HOT_MODULES)} hot modules with mypyc")

    def _pure(self) -> None:
        """Build no extension, and remove compiled modules an earlier build left where
        this one puts its files (a half-built module, its shim without the shared library,
        would not import; a stale one would shadow its newer .py)."""
        self.extensions = []
        places = [Path(self.build_lib)]
        if self.inplace or getattr(self, "editable_mode", False):
            places.append(Path(__file__).parent)
        names = [m.removesuffix(".py") for m in HOT_MODULES] + ["mpbroker/_native__mypyc"]
        for place in places:
            for name in names:
                for stale in place.glob(f"{name}.*.so"):
                    stale.unlink()
                    _say(f"removed {stale}, compiled by an earlier build")


def _compiled_extensions() -> list[Extension]:
    from mypyc.build import mypycify

    with tempfile.TemporaryDirectory() as scratch:
        # Not the project's strict [tool.mypy] (that is for the code's review): the build
        # environment need not have the third-party packages, whose values mypy then types
        # Any, which costs nothing here (they are C code already).
        config = Path(scratch, "mypy.ini")
        config.write_text("[mypy]\nignore_missing_imports = True\n")
        extensions: list[Extension] = mypycify(
            ["--config-file", str(config), *HOT_MODULES],
            opt_level="3",
            # Inside the package (mpbroker/_native__mypyc...so), so that an editable
            # install finds it where it finds the package.
            group_name="mpbroker._native",
        )
    return extensions


setup(
    # A stand-in, so that setuptools runs build_ext and tags the wheel for this platform;
    # BuildHotModules.run replaces it with what mypyc makes.
    ext_modules=[Extension("mpbroker._native_stand_in", sources=[])],
    cmdclass={"build_ext": BuildHotModules},
)
