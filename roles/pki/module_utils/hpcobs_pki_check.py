"""The site PKI on the controller, with the openssl command line: the site CA, and one key and certificate per host.

Pure parts (what a host's certificate must name, whether an existing one is still good, the openssl arguments) are
functions of their inputs, unit-tested in tests/test_pki.py; `ensure` runs openssl for what is missing or due only:
one `openssl x509` reading per existing certificate, two openssl runs per certificate (re)issued.
"""

import datetime
import ipaddress
import os
import re
import secrets
import subprocess
import tempfile

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
HOSTS_DIR = "hosts"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def san_entries(names):
    """subjectAltName entries of a list of names: IP:<address> for an IP address, DNS:<name> otherwise."""
    entries = []
    for name in names:
        name = str(name)
        try:
            entries.append("IP:%s" % ipaddress.ip_address(name))
        except ValueError:
            entries.append("DNS:%s" % name)
    return entries


def parse_x509_text(text):
    """{not_after: datetime (UTC), sans: set of 'DNS:x'/'IP:y', aki: hex} from the output of
    `openssl x509 -noout -enddate -ext subjectAltName,authorityKeyIdentifier`."""
    info = {"not_after": None, "sans": set(), "aki": ""}
    lines = text.splitlines()
    section = None
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("notAfter="):
            info["not_after"] = datetime.datetime.strptime(
                stripped.split("=", 1)[1].replace(" GMT", "").strip(), "%b %d %H:%M:%S %Y").replace(
                tzinfo=datetime.timezone.utc)
        elif "Subject Alternative Name" in stripped:
            section = "san"
        elif "Authority Key Identifier" in stripped:
            section = "aki"
        elif section == "san" and stripped:
            for part in stripped.split(","):
                part = part.strip()
                if part.startswith("IP Address:"):
                    info["sans"].add("IP:%s" % ipaddress.ip_address(part.split(":", 1)[1].strip()))
                elif part.startswith("DNS:"):
                    info["sans"].add(part)
            section = None
        elif section == "aki" and stripped:
            info["aki"] = stripped.replace("keyid:", "").replace(":", "").upper()
            section = None
    return info


def parse_ski_text(text):
    """The subject key identifier (hex, upper case) from `openssl x509 -noout -ext subjectKeyIdentifier`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if "Subject Key Identifier" in line and index + 1 < len(lines):
            return lines[index + 1].replace(":", "").upper()
    return ""


def renewal_reason(info, wanted_sans, ca_ski, renew_days, now=None):
    """'' when a certificate (parse_x509_text) is still good, else why it must be (re)issued: it expires within
    renew_days, names other hosts than wanted, or was signed by another CA."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if info is None:
        return "missing"
    if info["not_after"] is None:
        return "unreadable"
    if info["not_after"] - now < datetime.timedelta(days=renew_days):
        return "expires %s, within %d days" % (info["not_after"].date().isoformat(), renew_days)
    if set(info["sans"]) != set(san_entries(wanted_sans)):
        return "names %s, not %s" % (", ".join(sorted(info["sans"])), ", ".join(sorted(san_entries(wanted_sans))))
    if ca_ski and info["aki"] != ca_ski:
        return "signed by another CA"
    return ""


def ca_args(key, cert, days, subject):
    """openssl arguments that make a self-signed CA (EC P-256 key)."""
    return ["openssl", "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", cert, "-days", str(days), "-subj", subject, "-sha256",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash"]


def request_args(key, csr, name):
    """openssl arguments that make a host's key and certificate request."""
    return ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", "/CN=%s" % name]


def extensions(sans):
    """The extension file of a host certificate: its names, a server and client certificate, not a CA."""
    return ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
            "subjectAltName=%s\n" % ",".join(san_entries(sans)))


def sign_args(csr, ca_cert, ca_key, cert, days, extfile):
    """openssl arguments that sign a host's request with the site CA (random serial, no serial file)."""
    return ["openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-out", cert,
            "-days", str(days), "-sha256", "-set_serial", "0x" + secrets.token_hex(16), "-extfile", extfile]


def _run(args):
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(args[:2]), (result.stderr or result.stdout).strip()[-500:]))
    return result.stdout


def read_cert(path):
    """parse_x509_text of a certificate file, None when it does not exist."""
    if not os.path.exists(path):
        return None
    result = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-enddate",
                             "-ext", "subjectAltName,authorityKeyIdentifier"], capture_output=True, text=True)
    if result.returncode != 0:
        return {"not_after": None, "sans": set(), "aki": ""}
    return parse_x509_text(result.stdout)


def _private_dir(path, check_mode):
    if os.path.isdir(path):
        if os.stat(path).st_mode & 0o077 and not check_mode:
            os.chmod(path, 0o700)
        return
    if not check_mode:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)


def _issue(directory, name, sans, days, ca_cert, ca_key):
    hosts = os.path.join(directory, HOSTS_DIR)
    with tempfile.TemporaryDirectory(dir=hosts) as work:
        key, csr, cert, ext = (os.path.join(work, part) for part in ("key", "csr", "crt", "ext"))
        old = os.umask(0o077)
        try:
            _run(request_args(key, csr, name))
            with open(ext, "w", encoding="utf-8") as handle:
                handle.write(extensions(sans))
            _run(sign_args(csr, ca_cert, ca_key, cert, days, ext))
        finally:
            os.umask(old)
        os.chmod(key, 0o600)
        os.chmod(cert, 0o644)
        # the key first: a certificate is never beside a key it does not match for longer than a rename
        os.replace(key, os.path.join(hosts, name + ".key"))
        os.replace(cert, os.path.join(hosts, name + ".crt"))


def ensure(directory, hosts, days, renew_days, ca_days, ca_subject, check_mode=False, ca_cert=None, ca_key=None,
           now=None):
    """Make the site CA (unless ca_cert names the site's own) and every host's key and certificate that is missing
    or due. hosts: {name: [subject alternative names]}. Returns {ca_created, issued: {name: reason}, ca_expires}."""
    for name in hosts:
        if not _NAME.match(name) or name.startswith("."):
            raise ValueError("%r cannot be a certificate file name" % name)
    result = {"ca_created": False, "issued": {}, "ca_expires": ""}
    own_ca = bool(ca_cert)
    ca_cert = ca_cert or os.path.join(directory, CA_CERT)
    ca_key = ca_key or ("" if own_ca else os.path.join(directory, CA_KEY))
    _private_dir(directory, check_mode)
    _private_dir(os.path.join(directory, HOSTS_DIR), check_mode)
    ca_ski = ""
    if os.path.exists(ca_cert):
        ca_ski = parse_ski_text(_run(["openssl", "x509", "-in", ca_cert, "-noout", "-ext", "subjectKeyIdentifier"]))
        result["ca_expires"] = _run(["openssl", "x509", "-in", ca_cert, "-noout", "-enddate"]).strip().split("=", 1)[1]
    elif own_ca:
        raise ValueError("the site CA certificate %s does not exist" % ca_cert)
    elif os.path.exists(ca_key):
        raise ValueError("%s exists without its certificate %s: restore the certificate, or move the key away to make "
                         "a new site CA (every host then gets a new certificate)" % (ca_key, ca_cert))
    else:
        result["ca_created"] = True
        if not check_mode:
            old = os.umask(0o077)
            try:
                _run(ca_args(ca_key + ".new", ca_cert + ".new", ca_days, ca_subject))
            finally:
                os.umask(old)
            os.chmod(ca_key + ".new", 0o600)
            os.chmod(ca_cert + ".new", 0o644)
            os.replace(ca_key + ".new", ca_key)
            os.replace(ca_cert + ".new", ca_cert)
    if os.path.exists(ca_key) and os.stat(ca_key).st_mode & 0o077 and not check_mode:
        os.chmod(ca_key, 0o600)
    for name in sorted(hosts):
        cert = os.path.join(directory, HOSTS_DIR, name + ".crt")
        key = os.path.join(directory, HOSTS_DIR, name + ".key")
        if result["ca_created"]:
            reason = "new site CA"
        elif not os.path.exists(key):
            reason = "missing"
        else:
            reason = renewal_reason(read_cert(cert), hosts[name], ca_ski, renew_days, now)
        if not reason:
            continue
        if not ca_key or not (os.path.exists(ca_key) or check_mode):
            raise ValueError("%s: its certificate must be issued (%s), but there is no key of the site CA %s to sign "
                             "it: give the host's own certificate and key (hpcobs_tls_cert_file, hpcobs_tls_key_file) "
                             "or the CA's key (pki_ca_key_file)" % (name, reason, ca_cert))
        result["issued"][name] = reason
        if not check_mode:
            _issue(directory, name, hosts[name], days, ca_cert, ca_key)
    return result
