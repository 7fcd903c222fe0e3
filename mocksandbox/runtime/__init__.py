"""SandboxFusion's runtime: toolchains and the libraries its runners give programs.

:mod:`~mocksandbox.runtime.layout` reads a runtime dir (the engine asks it per run),
:mod:`~mocksandbox.runtime.catalog` says what each language needs and where it comes from,
:mod:`~mocksandbox.runtime.install` installs it (``mocksandbox runtime install``), and
:mod:`~mocksandbox.runtime.report` tells which languages run (``mocksandbox languages``).
:mod:`~mocksandbox.runtime.interpreters` finds the CPython production runs user code on (3.10), and
:mod:`~mocksandbox.runtime.production` holds production's Python packages as data and makes the
divergence notes of answers this runtime cannot match. :mod:`~mocksandbox.runtime.installer` makes
venvs and installs into them, by uv where it can be had and pip otherwise (the Makefile uses it
too), and :mod:`~mocksandbox.runtime.progress` turns pip's or uv's output into a line of progress.
"""
