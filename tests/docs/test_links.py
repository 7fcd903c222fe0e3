"""Every link leads somewhere (issue 36): no page, README line, package URL or help text names a site
the project does not publish (it publishes none: the docs are built from ``docs/`` by ``make docs``),
nor a package index entry it has not published (``pip install mocksandbox``); and the README's
relative links, which a code host follows, point at files of the checkout."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from mocksandbox.cli import build_parser
from mocksandbox.reference import _subcommands, cli_reference_markdown, settings_reference_markdown

ROOT = Path(__file__).resolve().parents[2]

#: External sites the text genuinely refers to, and that exist: a URL must start with one of these.
EXTERNAL_SITES = (
    "https://github.com/bytedance/SandboxFusion",
    # PyTorch's CPU wheels: where `runtime install --python-profile full` takes torch from.
    "https://download.pytorch.org/whl/cpu",
)
#: Top-level domains that name no site (RFC 2606 and 6761, and ICANN's .internal): examples'.
RESERVED_TLDS = {"test", "example", "invalid", "localhost", "internal"}

URL = re.compile(r"https?://[^\s<>()\[\]`'\"]+")
#: An install by index name: ``pip install mocksandbox`` (quoted, pinned or with options), but not
#: ``pip install 'mocksandbox[extra]'``, which adds an extra to an installed mocksandbox (pip takes
#: mocksandbox itself from what is installed) and is what a command prints when its extra is missing.
PIP_INSTALL_BY_NAME = re.compile(r"""pip3?\s+install\s+(?:-\S+\s+)*['"]?mocksandbox(?![\w.\-\[])""")
#: A Markdown link or image: ``[text](target)``.
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def names_no_site(host: str) -> bool:
    """Whether ``host`` is no site on the web: loopback and private addresses, ``localhost``, a
    single label (a compose service such as ``sandbox``) or a reserved example domain."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host or host.rsplit(".", 1)[-1] in RESERVED_TLDS
    return address.is_loopback or address.is_private


def dead_links(text: str) -> list[str]:
    """The URLs in ``text`` that name a site, other than :data:`EXTERNAL_SITES`, and the installs of
    a package index name this project has not published."""
    found = []
    for url in URL.findall(text):
        url = url.rstrip(".,;:")  # the sentence's, not the URL's
        host = urlsplit(url).hostname or ""
        if not names_no_site(host) and not url.startswith(EXTERNAL_SITES):
            found.append(url)
    return found + [match.group(0) for match in PIP_INSTALL_BY_NAME.finditer(text)]


def missing_targets(markdown: str, base: Path) -> list[str]:
    """The relative link targets in ``markdown`` that are no file or directory under ``base``."""
    targets = (target.split("#", 1)[0] for target in MARKDOWN_LINK.findall(markdown))
    return [t for t in targets if t and not URL.match(t) and not (base / t).exists()]


def project_texts() -> dict[str, str]:
    """Every text a reader meets: README, changelog, the docs' pages (the generated reference pages
    too), the site's and the package's configuration, and every command's help."""
    texts = {
        path.relative_to(ROOT).as_posix(): path.read_text() for path in sorted((ROOT / "docs").rglob("*.md"))
    }
    for name in ("README.md", "CHANGELOG.md", "mkdocs.yml", "pyproject.toml"):
        texts[name] = (ROOT / name).read_text()
    texts["docs/reference/settings.md (generated)"] = settings_reference_markdown()
    texts["docs/reference/cli.md (generated)"] = cli_reference_markdown()
    parser = build_parser()
    texts["mocksandbox --help"] = parser.format_help()
    for command, subparser in _subcommands(parser).items():
        texts[f"mocksandbox {command} --help"] = subparser.format_help()
    return texts


def test_no_text_links_to_a_site_or_an_index_entry_the_project_does_not_publish() -> None:
    dead = {name: found for name, text in project_texts().items() if (found := dead_links(text))}
    assert dead == {}, (
        "links to sites the project does not publish, or installs of a name on no package index: point "
        "them at a page in docs/ (or say how make docs builds it), and install from a checkout or a wheel; "
        f"an external site that exists and is referenced on purpose goes into EXTERNAL_SITES: {dead}"
    )


def test_the_package_metadata_names_no_url_that_leads_nowhere() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    urls = list(project.get("urls", {}).values())
    assert [url for url in urls if dead_links(url)] == []


def test_the_readmes_relative_links_point_at_files_of_the_checkout() -> None:
    assert missing_targets((ROOT / "README.md").read_text(), ROOT) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The README as it was before issue 36 fails every check; what the docs rightly show passes."""
    dead = dead_links(
        "published at https://mocksandbox.readthedocs.io/.\n"
        "[every setting](https://mocksandbox.readthedocs.io/reference/settings.html)\n"
        "Or `pip install mocksandbox` (add extras), pip install 'mocksandbox', pip install -U mocksandbox==0.1\n"
        'Documentation = "https://mocksandbox.dev/"\n'
    )
    assert dead == [
        "https://mocksandbox.readthedocs.io/",
        "https://mocksandbox.readthedocs.io/reference/settings.html",
        "https://mocksandbox.dev/",
        "pip install mocksandbox",
        "pip install 'mocksandbox",
        "pip install -U mocksandbox",
    ]
    fine = (
        "[SandboxFusion](https://github.com/bytedance/SandboxFusion) at http://127.0.0.1:8080/run_code, "
        "http://localhost:8080, http://sandbox:8080, https://sandbox.internal:8080, http://mocksandbox.test, "
        "http://10.0.0.5:8080; pip install 'mocksandbox[jupyter]', pip install -e '.[all]', "
        "pip install dist/mocksandbox-*.whl"
    )
    assert dead_links(fine) == []
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("")
    page = "[docs](docs/index.md#top) ![a picture](docs/console.png) [anchor](#install) [web](https://github.com/bytedance/SandboxFusion)"
    assert missing_targets(page, tmp_path) == ["docs/console.png"]
