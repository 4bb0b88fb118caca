"""An MCP server on the 2024-11-05 HTTP+SSE transport (GET /sse, POST /messages/),
written with the official Python SDK, for plexus's remote-upstream tests
(tests/tests/e2e/remote.rs): rmcp has no server for this transport.

Usage: sse_server.py --port PORT [--tls-dir DIR]

With --tls-dir it serves https with a certificate for 127.0.0.1 issued by a
throwaway CA, whose certificate it writes to DIR/ca.pem for the client to trust.
"""

import argparse
import datetime
import ipaddress
import pathlib

import uvicorn
from mcp.server.mcpserver import Context, MCPServer


def write_certificates(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A CA (written to ca.pem) and a server certificate for 127.0.0.1 it signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("plexus test CA"))
        .issuer_name(name("plexus test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certificate = directory / "server.pem"
    certificate.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    private_key = directory / "server-key.pem"
    private_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certificate, private_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-dir", type=pathlib.Path)
    args = parser.parse_args()

    server = MCPServer("sse-fixture")

    @server.tool()
    def echo(text: str) -> str:
        """Returns `text` unchanged."""
        return text

    @server.tool()
    def header(name: str, ctx: Context) -> str:
        """Returns the value of one header of the HTTP request that carried the call."""
        headers = ctx.headers or {}
        return headers.get(name.lower(), "(absent)")

    tls = {}
    if args.tls_dir is not None:
        certificate, private_key = write_certificates(args.tls_dir)
        tls = {"ssl_certfile": str(certificate), "ssl_keyfile": str(private_key)}
    config = uvicorn.Config(server.sse_app(), host="127.0.0.1", port=args.port, log_level="warning", **tls)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
