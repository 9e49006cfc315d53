"""Certificates for tests of TLS with client certificates, made with openssl in the test's folder: a CA, a server
certificate for 127.0.0.1 and a client certificate, both signed by that CA (the switch agent's and the controller's
HTTP API's tests)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(ca, server, client): each a path without its suffix, `.crt` and `.key` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, server, client = folder / "ca", folder / "server", folder / "client"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN=mbalancer test CA {folder.name}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    for who, extension in ((server, "subjectAltName=IP:127.0.0.1"), (client, "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who.name}", "-keyout", f"{who}.key",
                "-out", f"{who}.csr")
        extensions = folder / f"{who.name}.ext"
        extensions.write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                "-days", "2", "-extfile", str(extensions), "-out", f"{who}.crt")
    return ca, server, client
