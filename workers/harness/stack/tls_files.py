"""Throwaway TLS files for loopback servers: a CA, a server and a client certificate
(the client's key also encrypted, as ``client-enc.key``).

For the TLS variants of the stack (:mod:`workers.harness.stack.sentinel_pair`): made with
the ``openssl`` command, valid two days, the server's for ``127.0.0.1`` and
``localhost``. Redis uses the server's pair for its own outgoing links too (replication,
a Sentinel's links to the nodes and to its peers).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

KEY_PASSPHRASE = "secret"
"""The pass phrase of the client's encrypted key (``client-enc.key``)."""


@dataclass(frozen=True)
class TLSFiles:
    """Where the files are; ``directory`` is the caller's to remove."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, who: str) -> Path:
        return self.directory / f"{who}.crt"

    def key(self, who: str) -> Path:
        return self.directory / f"{who}.key"

    def server_options(self) -> list[tuple[str, str]]:
        """``redis-server`` directives for TLS with these files (ports apart)."""
        return [("tls-cert-file", str(self.cert("server"))),
                ("tls-key-file", str(self.key("server"))), ("tls-ca-cert-file", str(self.ca))]

    def client_kwargs(self) -> dict[str, str]:
        """redis-py's TLS keywords of a client that shows its certificate."""
        return {"ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.cert("client")),
                "ssl_keyfile": str(self.key("client"))}

    def query(self) -> str:
        """The same as a URL's query (``ssl_ca_certs=...&ssl_certfile=...``)."""
        return urlencode(self.client_kwargs(), safe="/")


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=60)


def make_tls_files(directory: Path) -> TLSFiles:
    """Generate the files in ``directory`` (it must exist); RuntimeError without openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("TLS test servers need the openssl command")
    # The CA's key usage: Python 3.13's default TLS context verifies strictly (X.509
    # strict mode refuses a CA certificate without it).
    _run(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
         "-out", "ca.crt", "-days", "2", "-subj", "/CN=compaction-test-ca",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    (directory / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, extra in (("server", ["-extfile", "ext.cnf"]), ("client", [])):
        _run(openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
        _run(openssl, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey",
             "ca.key", "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", *extra,
             cwd=directory)
    _run(openssl, "pkcs8", "-topk8", "-in", "client.key", "-out", "client-enc.key",
         "-passout", f"pass:{KEY_PASSPHRASE}", cwd=directory)
    return TLSFiles(directory)


__all__ = ["KEY_PASSPHRASE", "TLSFiles", "make_tls_files"]
