"""What each language needs beyond the engine, and where ``runtime install`` gets it, as data.

Two tables: :data:`LIBRARIES`, SandboxFusion's runtime libraries (its ``runtime/`` dir, and the
modules its image installs for Perl and Lua), and :data:`LANGUAGE_NEEDS`, one entry per language of
the execution table: the toolchain that runs its commands, and the libraries its programs expect.

The package sources are the ones this project can use: Debian packages (toolchains, Java jars, Go
sources, Perl and Lua modules), the npm registry (``node_modules``) and PyPI (the Python runtime).
Where none of them has a thing, the entry says why instead (``unavailable``), and ``mocksandbox
languages`` shows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mocksandbox.execution.languages import JAVATUPLES_JAR, JUNIT_API_JAR, JUNIT_CONSOLE_JAR


@dataclass(frozen=True)
class Toolchain:
    """The programs a language's commands call."""

    #: Each must be on PATH (the runtime's ``bin/`` included) for the language to run.
    binaries: tuple[str, ...]
    #: Prints the version (the first non-empty line of its output is shown).
    version_argv: tuple[str, ...]
    #: Debian packages that provide ``binaries`` (installed only where a binary is missing).
    debian: tuple[str, ...] = ()
    #: Links or scripts ``runtime install`` puts in the runtime's ``bin/`` (see ``install.SHIMS``).
    shims: tuple[str, ...] = ()
    #: Why ``runtime install`` cannot get it from the package sources this project uses.
    unavailable: str = ""


@dataclass(frozen=True)
class Library:
    """A runtime library set: what SandboxFusion's image has for one language's programs."""

    name: str
    description: str
    #: Paths under the runtime dir that are there when it is installed.
    paths: tuple[str, ...] = ()
    #: A command that succeeds when it is installed outside the runtime dir (system modules).
    probe_argv: tuple[str, ...] = ()
    #: Debian packages it is made from (or that provide it).
    debian: tuple[str, ...] = ()
    #: Why ``runtime install`` cannot get it here.
    unavailable: str = ""


@dataclass(frozen=True)
class LanguageNeeds:
    toolchain: Toolchain
    libraries: tuple[str, ...] = ()
    #: The interpreter is Settings.python (the runtime's venv, else the server's own).
    python: bool = False


#: The jars of SandboxFusion's runtime/java and the Debian files they are copied from (Debian's
#: versions: javatuples 1.2 as there; JUnit 5.9 where SandboxFusion ships 5.8's console launcher).
JAVA_JARS: Mapping[str, str] = {
    f"java/{JAVATUPLES_JAR}": "/usr/share/java/javatuples.jar",
    f"java/{JUNIT_CONSOLE_JAR}": "/usr/share/java/junit-platform-console-standalone.jar",
    # SandboxFusion puts a javadoc jar on the class path (it adds nothing: the console launcher
    # bundles the Jupiter API); the API jar stands in for it under the same name.
    f"java/{JUNIT_API_JAR}": "/usr/share/java/junit-jupiter-api.jar",
}

#: Node packages of SandboxFusion's runtime/node/package.json, plus what its image installs
#: globally for TypeScript (``npm install -g typescript@5.3.3 tsx@4.7.1``).
NODE_DEPENDENCIES: Mapping[str, str] = {
    "@babel/core": "^7.24.5",
    "@babel/preset-env": "^7.24.5",
    "@babel/preset-typescript": "^7.24.1",
    "@jest/globals": "^29.7.0",
    "@testing-library/dom": "^10.1.0",
    "@testing-library/jest-dom": "^6.4.5",
    "babel-jest": "^29.7.0",
    "commander": "^12.1.0",
    "jest": "^29.7.0",
    "jest-json-reporter": "^1.2.2",
    "js-md5": "^0.7.3",
    "jsdom": "^24.1.0",
    "lodash": "^4.17.21",
    "puppeteer": "^22.9.0",
    "random-seed": "^0.3.0",
    "seedrandom": "^3.0.5",
    "tsx": "4.7.1",
    "typescript": "5.3.3",
}

#: Debian's sources for the Go libraries of SandboxFusion's runtime/go module (GOPATH layout under
#: /usr/share/gocode). Debian has no gorm.io/gorm nor go-enry v2: programs importing them fail.
GO_DEBIAN_PACKAGES = (
    "golang-github-stretchr-testify-dev",
    "golang-github-spf13-cobra-dev",
    "golang-github-spf13-pflag-dev",
    "golang-github-spf13-viper-dev",
    "golang-github-sirupsen-logrus-dev",
    "golang-go.uber-zap-dev",
    "golang-go.uber-atomic-dev",
    "golang-uber-goleak-dev",
    "golang-uber-automaxprocs-dev",
    "golang-gopkg-yaml.v2-dev",
    "golang-gopkg-yaml.v3-dev",
    "golang-golang-x-text-dev",
    "golang-golang-x-oauth2-dev",
    "golang-github-opentracing-opentracing-go-dev",
    "golang-github-go-openapi-inflect-dev",
    "golang-opentelemetry-otel-dev",
)

#: The kernel side of /run_jupyter. ipykernel 7.1 to 7.3 now and then leave a request unanswered
#: (here 6 in 120 concurrent requests with 7.1 hung to their deadline); 7.4 did not (none in 280),
#: nor does 6.29. 7.4 needs Python 3.11, so production's 3.10 gets 6.29.5, with SandboxFusion's
#: jupyter_client 8.6.2 (which holds ipykernel 7 at 7.1, so 3.11 and later go without its pin).
JUPYTER_KERNEL_REQUIREMENTS = (
    'ipykernel==6.29.5; python_version < "3.11"',
    'jupyter_client==8.6.2; python_version < "3.11"',
    'ipykernel>=7.4; python_version >= "3.11"',
)

#: The Python runtime's default set (profile ``default``): SandboxFusion's pins (its
#: runtime/python/requirements.txt) for the packages reward code imports most, and the kernel side
#: of /run_jupyter. Its full list (torch, tensorflow, ... several GB) is profile ``full``.
PYTHON_REQUIREMENTS = (
    "numpy==1.26.3",
    "pandas==2.2.0",
    "scipy==1.11.4",
    "scikit-learn==1.4.0",
    "matplotlib==3.8.2",
    "seaborn==0.13.2",
    "statsmodels==0.14.1",
    "requests==2.31.0",
    "beautifulsoup4==4.12.3",
    "lxml==5.1.0",
    "pytest==7.4.4",
    "pytest-mock==3.12.0",
    "toml==0.10.2",
    "tabulate==0.9.0",
    "psutil==5.9.8",
    "pydantic==2.6.4",
    "jsonlines==4.0.0",
    "openpyxl==3.1.2",
    "pillow==10.2.0",
    "cryptography==42.0.5",
    "PyJWT==2.8.0",
    "Faker==25.1.0",
    *JUPYTER_KERNEL_REQUIREMENTS,
    # Not in SandboxFusion's list, but production has it: torch 2.1.2 requires it (unpinned).
    "sympy",
)

#: ``runtime install --python-profile``: which requirements the Python runtime gets.
PYTHON_PROFILES = ("default", "full")
#: Where torch's CPU-only builds are (PyPI's torch 2.1.2 for Linux is the CUDA 12.1 build, which
#: brings some 2.5 GB of nvidia-* packages; it runs on a CPU too, and is what pip takes when this
#: index cannot be reached).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def python_profile_requirements(profile: str) -> tuple[str, ...]:
    """The requirement lines of a profile: ``default`` (:data:`PYTHON_REQUIREMENTS`) or ``full``
    (SandboxFusion's whole requirements.txt, as pinned there). ``full`` leaves out SandboxFusion's
    ``--ignore-requires-python``: with it, today's pip takes releases that need a newer Python
    than 3.10 (contourpy 1.3.3 for matplotlib) and fails; without it the list resolves on 3.10."""
    from mocksandbox.runtime.production import sandboxfusion_requirements

    if profile == "default":
        return PYTHON_REQUIREMENTS
    if profile == "full":
        # jupyter 1.0.0 (in the list) would bring ipykernel 7.1, which now and then leaves a
        # request unanswered (JUPYTER_KERNEL_REQUIREMENTS); 6.29.5 suits jupyter_client 8.6.2.
        return (*sandboxfusion_requirements(), "ipykernel==6.29.5")
    raise ValueError(f"unknown Python profile {profile!r}; known: {', '.join(PYTHON_PROFILES)}")


_JVM = ("default-jdk-headless",)

LIBRARIES: Mapping[str, Library] = {
    library.name: library
    for library in (
        Library(
            "javatuples",
            "javatuples 1.2 on the class path of Java runs",
            paths=(f"java/{JAVATUPLES_JAR}",),
            debian=("libjavatuples-java",),
        ),
        Library(
            "junit5",
            "the JUnit Platform console launcher and Jupiter API for JUnit runs",
            paths=(f"java/{JUNIT_CONSOLE_JAR}", f"java/{JUNIT_API_JAR}"),
            debian=("junit5",),
        ),
        Library(
            "node_modules",
            "jest (SandboxFusion's configuration and JSON report), babel, lodash, jsdom, tsx, ...",
            paths=(
                *(f"node/node_modules/{name}/package.json" for name in NODE_DEPENDENCIES),
                "node/package.json",
                "node/babel.config.js",
            ),
        ),
        Library(
            "go_modules",
            "testify, cobra, viper, zap, logrus, yaml, ... (Debian's sources, GOPATH mode)",
            paths=("go/go.mod", "go/main.go", "go/gopath"),
            debian=GO_DEBIAN_PACKAGES,
        ),
        Library(
            "python_runtime",
            "a venv with SandboxFusion's pinned packages (numpy, pandas, pytest, ...)",
            paths=("python/venv/bin/python",),
        ),
        Library(
            "perl_modules",
            "Test::Deep and Data::Compare",
            probe_argv=("perl", "-MTest::Deep", "-MData::Compare", "-e", "1"),
            debian=("libtest-deep-perl", "libdata-compare-perl"),
        ),
        Library(
            "luaunit",
            "luaunit",
            probe_argv=("lua", "-e", "require('luaunit')"),
            debian=("lua-unit",),
        ),
        Library(
            "mathlib",
            "a Lake project with Mathlib built (miniF2F's imports)",
            paths=("lean/lakefile.lean", "lean/.lake/packages"),
            unavailable="Mathlib and the Lean toolchain come from GitHub releases and repositories, "
            "which this project's package sources do not include",
        ),
    )
}

_NODE = Toolchain(("node",), ("node", "--version"), debian=("nodejs",))
_GO = Toolchain(("go",), ("go", "version"), debian=("golang-go",))
_JAVA = Toolchain(("javac", "java"), ("javac", "-version"), debian=_JVM)
_NO_GPU = "needs an NVIDIA GPU and CUDA toolkit; not installed by `runtime install`"

LANGUAGE_NEEDS: Mapping[str, LanguageNeeds] = {
    "python": LanguageNeeds(Toolchain((), ()), ("python_runtime",), python=True),
    "pytest": LanguageNeeds(Toolchain((), ()), ("python_runtime",), python=True),
    "cpp": LanguageNeeds(Toolchain(("g++",), ("g++", "--version"), debian=("g++", "libssl-dev"))),
    "nodejs": LanguageNeeds(_NODE, ("node_modules",)),
    "typescript": LanguageNeeds(
        Toolchain(("node", "tsx"), ("tsx", "--version"), debian=("nodejs",), shims=("tsx", "tsc")),
        ("node_modules",),
    ),
    "jest": LanguageNeeds(
        Toolchain(("node", "npm"), ("npm", "--version"), debian=("nodejs", "npm")), ("node_modules",)
    ),
    "go": LanguageNeeds(_GO, ("go_modules",)),
    "go_test": LanguageNeeds(_GO, ("go_modules",)),
    "java": LanguageNeeds(_JAVA, ("javatuples",)),
    "junit": LanguageNeeds(_JAVA, ("junit5",)),
    "csharp": LanguageNeeds(
        Toolchain(
            ("dotnet",),
            ("dotnet", "--version"),
            unavailable="the .NET SDK is not packaged by Debian (Microsoft's own apt source is needed)",
        )
    ),
    "rust": LanguageNeeds(Toolchain(("rustc",), ("rustc", "--version"), debian=("rustc",))),
    "bash": LanguageNeeds(Toolchain(("bash",), ("bash", "--version"), debian=("bash",))),
    "php": LanguageNeeds(Toolchain(("php",), ("php", "--version"), debian=("php-cli",))),
    "lua": LanguageNeeds(Toolchain(("lua",), ("lua", "-v"), debian=("lua5.4",)), ("luaunit",)),
    "R": LanguageNeeds(Toolchain(("Rscript",), ("Rscript", "--version"), debian=("r-base-core",))),
    "perl": LanguageNeeds(Toolchain(("perl",), ("perl", "-v"), debian=("perl",)), ("perl_modules",)),
    "ruby": LanguageNeeds(Toolchain(("ruby",), ("ruby", "--version"), debian=("ruby",))),
    # Debian has no DMD; LDC's dmd-compatible driver answers to the name SandboxFusion calls.
    "D_ut": LanguageNeeds(Toolchain(("dmd",), ("dmd", "--version"), debian=("ldc",), shims=("dmd",))),
    "scala": LanguageNeeds(Toolchain(("scalac", "scala"), ("scalac", "-version"), debian=("scala", *_JVM))),
    "julia": LanguageNeeds(
        Toolchain(("julia",), ("julia", "--version"), unavailable="Debian 12 has no julia package")
    ),
    # Debian's Kotlin (1.3) runs scripts only as `kotlinc -script`: a shim answers to `kotlin x.kts`.
    "kotlin_script": LanguageNeeds(
        Toolchain(("kotlin",), ("kotlinc", "-version"), debian=("kotlin", *_JVM), shims=("kotlin",))
    ),
    "verilog": LanguageNeeds(Toolchain(("iverilog", "vvp"), ("iverilog", "-V"), debian=("iverilog",))),
    "lean": LanguageNeeds(
        Toolchain(
            ("lake",),
            ("lake", "--version"),
            unavailable="Lean 4 toolchains come from GitHub releases (elan), not a package source "
            "this project uses",
        ),
        ("mathlib",),
    ),
    "swift": LanguageNeeds(
        Toolchain(("swiftc",), ("swiftc", "--version"), unavailable="Debian has no Swift toolchain")
    ),
    "racket": LanguageNeeds(Toolchain(("racket",), ("racket", "--version"), debian=("racket",))),
    "cuda": LanguageNeeds(Toolchain(("nvcc", "cmake"), ("nvcc", "--version"), unavailable=_NO_GPU)),
    "python_gpu": LanguageNeeds(
        Toolchain(("nvidia-smi",), ("nvidia-smi", "--version"), unavailable=_NO_GPU), python=True
    ),
}


def install_hint(language: str) -> str:
    """The command that adds what ``language`` lacks."""
    return f"mocksandbox runtime install --languages {language}"
