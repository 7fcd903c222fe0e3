"""Writes the reference pages from the code at build time (mkdocs-gen-files): every setting from
the settings model, every command and option from the argument parser. Nothing is copied by
hand: a setting or an option added in code is on the site with no second edit."""

from __future__ import annotations

import mkdocs_gen_files

from mocksandbox.reference import cli_reference_markdown, settings_reference_markdown

with mkdocs_gen_files.open("reference/settings.md", "w") as page:
    page.write(settings_reference_markdown())

with mkdocs_gen_files.open("reference/cli.md", "w") as page:
    page.write(cli_reference_markdown())
