"""The server's SSLContext from nsqd's TLS flags (--tls-cert, --tls-key, --tls-min-version, --tls-root-ca-file,
--tls-client-auth-policy). Built once in the supervisor before fork to fail at start on a bad file, then again in
each worker that needs it (``nsqpy.workers.connections.transport.worker_context``)."""
import _ssl
import ctypes
import ssl

from nsqpy.config.common import TLSVersion

_MIN_VERSION = {TLSVersion.TLS1_0: ssl.TLSVersion.TLSv1, TLSVersion.TLS1_1: ssl.TLSVersion.TLSv1_1,
                TLSVersion.TLS1_2: ssl.TLSVersion.TLSv1_2, TLSVersion.TLS1_3: ssl.TLSVersion.TLSv1_3}


def server_context(opts):
    """The SSLContext for --tls-cert/--tls-key (None without them). Raises OSError/ssl.SSLError on bad files."""
    if not opts.tls_cert:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    ctx.minimum_version = _MIN_VERSION[opts.tls_min_version]
    if opts.tls_client_auth_policy:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if opts.tls_client_auth_policy == "require":
            _accept_any_certificate(ctx)  # nsqd's RequireAnyClientCert: a certificate, not verified
        elif opts.tls_root_ca_file:
            ctx.load_verify_locations(opts.tls_root_ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return ctx


_VERIFY_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_ACCEPT_ALL = _VERIFY_CALLBACK(lambda preverify_ok, store: 1)  # module-level: OpenSSL keeps the pointer
_SSL_VERIFY_PEER_AND_FAIL_IF_NONE = 3


def _accept_any_certificate(ctx):
    """Python's ssl cannot ask for a client certificate without verifying it (there is no verify callback in
    its API), which nsqd's --tls-client-auth-policy=require does. So the context's OpenSSL SSL_CTX gets a
    callback that accepts every certificate: its pointer is the first field after the object header of
    CPython's PySSLContext, checked here by reading back the verify mode just set through the API before
    anything is written; libssl is reached through the _ssl module's own handle (the very library it uses)."""
    lib = ctypes.CDLL(_ssl.__file__)
    lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
    lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_set_verify.restype = None
    lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VERIFY_CALLBACK]
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr or lib.SSL_CTX_get_verify_mode(ptr) != _SSL_VERIFY_PEER_AND_FAIL_IF_NONE:
        raise ValueError("--tls-client-auth-policy=require is not supported by this Python's ssl module")
    lib.SSL_CTX_set_verify(ptr, _SSL_VERIFY_PEER_AND_FAIL_IF_NONE, _ACCEPT_ALL)
