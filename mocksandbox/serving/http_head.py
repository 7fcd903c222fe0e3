"""A request's head parsed as ``http.server`` parses it, its plain headers without the email parser.

``BaseHTTPRequestHandler.parse_request`` reads the header block and hands it to
``email.parser.Parser``, whose feed parser (line splitting, header regexes, a content-type look for
multipart payloads, policies) took about a sixth of the server's Python time for a short
``/run_code`` (yappi, under load). Nearly every request's headers are plain ``Name: value`` lines;
for those, :func:`parse_header_lines` builds the same ``HTTPMessage`` directly (the same names,
values and order as the email parser stores them). Any line it does not know for plain (folded,
without a colon, a ``From `` line, a stray carriage return) sends the whole block to the email
parser, as before. :func:`parse_request` is the standard library's (identical in 3.11 to 3.13),
with that one call replaced; its answers to bad requests are the same.
"""

from __future__ import annotations

import email.parser
import http.client
import re
from http import HTTPStatus
from typing import Any, BinaryIO

#: The standard library's limits on a header block (``http.client._MAXLINE``, ``_MAXHEADERS``).
MAX_LINE = 65536
MAX_HEADERS = 100

#: A plain header line: a name of the characters the email parser takes for one (printable ASCII
#: but the colon), the colon, spaces or tabs it drops, and a value without carriage return or line
#: feed, ended by CRLF or LF.
_PLAIN_HEADER = re.compile(rb"([\x21-\x39\x3b-\x7e]+):[ \t]*([^\r\n]*)\r?\n")


def read_header_lines(rfile: BinaryIO) -> list[bytes]:
    """The header block's lines up to and with the blank line (or the end of the stream), with
    the standard library's limits (``http.client.LineTooLong``, ``http.client.HTTPException``)."""
    lines = []
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            return lines


class PlainHeaders(http.client.HTTPMessage):
    """An ``HTTPMessage`` of plain headers, read without its policy's work on each value.

    ``get`` and ``items`` of an ``HTTPMessage`` pass every value through its policy (``compat32``),
    which returns it unchanged unless it holds surrogates (it then wraps it in a ``Header``).
    Values decoded from ISO-8859-1, as every header here is, hold none; so these give the same
    answers with three Python calls less per value (werkzeug reads each header, the handler a
    few of them twice: about 30 calls a request)."""

    def get(self, name: str, failobj: Any = None) -> Any:
        name = name.lower()
        for key, value in self._headers:  # type: ignore[attr-defined]
            if key.lower() == name:
                return value
        return failobj

    def items(self) -> list[tuple[str, Any]]:
        return list(self._headers)  # type: ignore[attr-defined]


def parse_header_lines(lines: list[bytes], message_class: type[http.client.HTTPMessage]) -> Any:
    """The headers of ``lines`` (as :func:`read_header_lines` gives them) as ``message_class``,
    as ``http.client.parse_headers`` makes it (as :class:`PlainHeaders` where that is the
    standard library's ``HTTPMessage`` and every line is plain)."""
    message = (PlainHeaders if message_class is http.client.HTTPMessage else message_class)()
    for line in lines[:-1]:
        plain = _PLAIN_HEADER.fullmatch(line)
        if plain is None:
            text = b"".join(lines).decode("iso-8859-1")
            return email.parser.Parser(_class=message_class).parsestr(text)
        message.set_raw(plain[1].decode("iso-8859-1"), plain[2].decode("iso-8859-1"))
    message.set_payload("")  # (as the email parser leaves it: an empty payload, never None)
    return message


def parse_request(handler: Any) -> bool:
    """``BaseHTTPRequestHandler.parse_request`` for ``handler``, its headers parsed by
    :func:`parse_header_lines`: the request line, the version checks, the headers, ``Connection``
    and ``Expect``. Whether the request may be served; if not, the error is sent already."""
    handler.command = None  # set in case of error on the first line
    handler.request_version = version = handler.default_request_version
    handler.close_connection = True
    requestline = str(handler.raw_requestline, "iso-8859-1").rstrip("\r\n")
    handler.requestline = requestline
    words = requestline.split()
    if len(words) == 0:
        return False
    if len(words) >= 3:  # enough to determine the protocol version
        version = words[-1]
        try:
            if not version.startswith("HTTP/"):
                raise ValueError
            base_version_number = version.split("/", 1)[1]
            version_number = base_version_number.split(".")
            # RFC 2145 3.1: one ".", major and minor compared as integers, leading zeros ignored.
            if len(version_number) != 2:
                raise ValueError
            if any(not component.isdigit() for component in version_number):
                raise ValueError("non digit in http version")
            if any(len(component) > 10 for component in version_number):
                raise ValueError("unreasonable length http version")
            major_minor = int(version_number[0]), int(version_number[1])
        except (ValueError, IndexError):
            handler.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
            return False
        if major_minor >= (1, 1) and handler.protocol_version >= "HTTP/1.1":
            handler.close_connection = False
        if major_minor >= (2, 0):
            handler.send_error(
                HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({base_version_number})"
            )
            return False
        handler.request_version = version
    if not 2 <= len(words) <= 3:
        handler.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({requestline!r})")
        return False
    command, path = words[:2]
    if len(words) == 2:
        handler.close_connection = True
        if command != "GET":
            handler.send_error(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({command!r})")
            return False
    handler.command, handler.path = command, path
    # gh-87389: "//path" reduced to "/path" (clients read "//path" as a host).
    if handler.path.startswith("//"):
        handler.path = "/" + handler.path.lstrip("/")
    try:
        handler.headers = parse_header_lines(read_header_lines(handler.rfile), handler.MessageClass)
    except http.client.LineTooLong as err:
        handler.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", str(err))
        return False
    except http.client.HTTPException as err:
        handler.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers", str(err))
        return False
    conntype = handler.headers.get("Connection", "")
    if conntype.lower() == "close":
        handler.close_connection = True
    elif conntype.lower() == "keep-alive" and handler.protocol_version >= "HTTP/1.1":
        handler.close_connection = False
    expect = handler.headers.get("Expect", "")
    expects = expect.lower() == "100-continue" and handler.request_version >= "HTTP/1.1"
    if not expects or handler.protocol_version < "HTTP/1.1":
        return True
    return bool(handler.handle_expect_100())  # (100 Continue sent, or an error and False)
