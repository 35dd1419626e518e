"""Secrets in the Alertmanager configuration of roles/alertmanager: deny by default (unit-tested in
tests/test_alertmanager_secrets.py).

`hpcobs_alertmanager_secret_problems` refuses every secret written inline into alertmanager.yml, naming where it is
and never its value. Which keys hold a secret comes from Alertmanager's own config package, for the release the
bundle pins (files/artifacts.yml: 0.33.1): the fields typed Secret, SecretURL or SecretTemplateURL of each
integration (config/notifiers.go, config/config.go GlobalConfig, notify/*/config.go) and of the HTTP client settings
every integration accepts (`http_config`, prometheus/common config v0.67, the version Alertmanager 0.33.1 builds
with). Each of them but two has a `*_file` twin, which the message names; a key shaped like a secret that the table
does not know (a newer integration) is refused too. Where no file variant exists (`sns_configs` `sigv4.secret_key`,
`http_config.proxy_connect_header`) or a URL carries credentials (user:password@ or a query string) in a key without
a file twin, the message says so: use what the integration reads from elsewhere, or set
`alertmanager_allow_inline_secrets: true`, after which the role writes alertmanager.yml with `diff: false` and
`no_log`. Every `*_file` under alertmanager_secrets_dir must name a secret of alertmanager_secrets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

# Inline secret key of each integration -> its file twin (Alertmanager 0.33.1).
INTEGRATION_SECRETS = {
    "discord_configs": {"webhook_url": "webhook_url_file"},
    "email_configs": {"auth_password": "auth_password_file", "auth_secret": "auth_secret_file"},
    "incidentio_configs": {"alert_source_token": "alert_source_token_file"},
    "jira_configs": {},
    "mattermost_configs": {"webhook_url": "webhook_url_file"},
    "msteams_configs": {"webhook_url": "webhook_url_file"},
    "msteamsv2_configs": {"webhook_url": "webhook_url_file"},
    "opsgenie_configs": {"api_key": "api_key_file"},
    "pagerduty_configs": {"routing_key": "routing_key_file", "service_key": "service_key_file"},
    "pushover_configs": {"user_key": "user_key_file", "token": "token_file"},
    "rocketchat_configs": {"token": "token_file", "token_id": "token_id_file"},
    "slack_configs": {"api_url": "api_url_file", "app_token": "app_token_file"},
    "sns_configs": {},
    "telegram_configs": {"bot_token": "bot_token_file"},
    "victorops_configs": {"api_key": "api_key_file"},
    "webex_configs": {},
    "webhook_configs": {"url": "url_file"},
    "wechat_configs": {"api_secret": "api_secret_file"},
}
GLOBAL_SECRETS = {
    "smtp_auth_password": "smtp_auth_password_file", "smtp_auth_secret": "smtp_auth_secret_file",
    "slack_api_url": "slack_api_url_file", "slack_app_token": "slack_app_token_file",
    "opsgenie_api_key": "opsgenie_api_key_file", "wechat_api_secret": "wechat_api_secret_file",
    "victorops_api_key": "victorops_api_key_file", "telegram_bot_token": "telegram_bot_token_file",
    "rocketchat_token": "rocketchat_token_file", "rocketchat_token_id": "rocketchat_token_id_file",
    "mattermost_webhook_url": "mattermost_webhook_url_file",
}
# Inside http_config (and oauth2's own tls_config): path -> file twin, None where upstream has none.
HTTP_SECRETS = {
    ("basic_auth", "password"): "password_file",
    ("authorization", "credentials"): "credentials_file",
    ("bearer_token",): "bearer_token_file",
    ("oauth2", "client_secret"): "client_secret_file",
    ("tls_config", "key"): "key_file",
    ("oauth2", "tls_config", "key"): "key_file",
    ("proxy_connect_header",): None,
    ("oauth2", "proxy_connect_header"): None,
}
# Outside http_config, secrets without a file variant.
NO_FILE = {("sns_configs", "sigv4", "secret_key"):
           "the SNS integration can read AWS credentials from the AWS shared files instead: set sigv4.profile (or "
           "sigv4.role_arn) and leave access_key/secret_key out"}
NO_FILE_HINT = ("Alertmanager has no file variant for it: take the credential from elsewhere, or accept it inline "
                "with alertmanager_allow_inline_secrets: true (alertmanager.yml is then written with no diff and "
                "no log)")
# Keys shaped like secrets that upstream types as plain strings (identifiers, not credentials).
NOT_SECRET = {("victorops_configs", "routing_key"), ("sns_configs", "sigv4", "access_key")}
SHAPE = re.compile(r"(^|_)(password|passwd|secret|token|key|credentials)(_|$)|password")
CREDENTIAL_URL = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#]*@|\?", re.I)
SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _where(path):
    out = path[0]
    for part in path[1:]:
        out += "[%d]" % part if isinstance(part, int) else ".%s" % part
    return out


def _twin_message(where, key, twin):
    return ("%s: %s is a secret written inline; put its value in alertmanager_secrets (from a vault) and set %s: "
            "\"{{ alertmanager_secrets_dir }}/<secret name>\" instead" % (where, key, twin))


def _check_http(config, path, problems, allow_inline):
    if not isinstance(config, Mapping):
        return
    for keys, twin in HTTP_SECRETS.items():
        node = config
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping) or node.get(keys[-1]) in (None, "", [], {}):
            continue
        where = _where(path + list(keys[:-1]))
        if twin:
            problems.append(_twin_message(where, keys[-1], twin))
        elif not allow_inline:
            problems.append("%s: %s holds secrets written inline; %s" % (where, keys[-1], NO_FILE_HINT))
    headers = config.get("http_headers")
    if isinstance(headers, Mapping):
        for name, header in headers.items():
            if isinstance(header, Mapping) and header.get("secrets"):
                problems.append("%s: secrets are written inline; put each in alertmanager_secrets and list its file "
                                "under files instead" % _where(path + ["http_headers", str(name)]))


def _check_mapping(node, path, integration, known, problems, allow_inline, depth=()):
    """Secret-shaped keys of one integration entry (or of global), recursively, http_config apart."""
    for key, value in node.items():
        key = str(key)
        if value in (None, "", [], {}) or key.endswith("_file"):
            continue
        if key == "http_config":
            _check_http(value, path + [key], problems, allow_inline)
            continue
        if isinstance(value, Mapping):
            _check_mapping(value, path + [key], integration, {}, problems, allow_inline, depth + (key,))
            continue
        here = (integration,) + depth + (key,)
        if not depth and key in known:
            problems.append(_twin_message(_where(path), key, known[key]))
        elif here in NO_FILE:
            if not allow_inline:
                problems.append("%s: %s is a secret written inline; %s; %s"
                                % (_where(path), key, NO_FILE_HINT, NO_FILE[here]))
        elif SHAPE.search(key) and here not in NOT_SECRET:
            twin = key + "_file"
            problems.append("%s: %s looks like a secret written inline; if Alertmanager has %s, put the value in "
                            "alertmanager_secrets and use %s; if it has no file variant, set "
                            "alertmanager_allow_inline_secrets: true" % (_where(path), key, twin, twin))
        elif key.endswith("url") and isinstance(value, str) and CREDENTIAL_URL.search(value):
            if not allow_inline:
                problems.append("%s: %s holds credentials or a query string (a token in disguise); %s"
                                % (_where(path), key, NO_FILE_HINT))


def secret_problems(global_config, receivers, secrets, secrets_dir, allow_inline=False):
    """Problems (strings that never contain a secret's value) of the inline secrets of `global_config`
    (alertmanager_global) and `receivers` (alertmanager_receivers), and of the secrets (alertmanager_secrets) the
    `*_file` keys under `secrets_dir` refer to."""
    problems = []
    if isinstance(global_config, Mapping):
        _check_mapping(global_config, ["alertmanager_global"], "global", GLOBAL_SECRETS, problems, allow_inline)
    for number, receiver in enumerate(receivers if isinstance(receivers, (list, tuple)) else []):
        if not isinstance(receiver, Mapping):
            continue
        label = "alertmanager_receivers[%d] (%s)" % (number, receiver.get("name", "?"))
        for integration, entries in receiver.items():
            integration = str(integration)
            if integration == "name" or not isinstance(entries, (list, tuple)):
                continue
            known = INTEGRATION_SECRETS.get(integration, {})
            for index, entry in enumerate(entries):
                if isinstance(entry, Mapping):
                    _check_mapping(entry, [label + " " + integration, index], integration, known, problems,
                                   allow_inline)
    if not isinstance(secrets, Mapping):
        return problems + ["alertmanager_secrets must map secret names to values"]
    for name in sorted(str(n) for n in secrets):
        if not SECRET_NAME.match(name):
            problems.append("alertmanager_secrets: %s is not a file name ([A-Za-z0-9][A-Za-z0-9_.-]*)" % json.dumps(name))
    problems += ["alertmanager_secrets: the value of %s is not a string" % name
                 for name, value in sorted(secrets.items(), key=lambda kv: str(kv[0])) if not isinstance(value, str)]
    prefix = str(secrets_dir).rstrip("/") + "/"
    refs = re.findall(r'"[a-z_]+_file": "%s([^"]+)"' % re.escape(prefix),
                      json.dumps([global_config, receivers], default=str))
    missing = sorted(set(refs) - set(str(n) for n in secrets))
    if missing:
        problems.append("secret files referred to but not in alertmanager_secrets: %s" % ", ".join(missing))
    return problems


class FilterModule:
    def filters(self):
        return {"hpcobs_alertmanager_secret_problems": secret_problems}
