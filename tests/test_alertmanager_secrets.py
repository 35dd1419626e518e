"""roles/alertmanager/filter_plugins/hpcobs_alertmanager.py: every secret of Alertmanager 0.33.1's receivers, global
section and HTTP client settings is refused inline (its *_file twin named), and no message shows a value."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "hpcobs_alertmanager", os.path.join(ROOT, "roles", "alertmanager", "filter_plugins", "hpcobs_alertmanager.py"))
am = importlib.util.module_from_spec(spec)
spec.loader.exec_module(am)

DIR = "/etc/alertmanager/secrets"
VALUE = "s3cr3t-VALUE-never-shown"


def problems(receivers=(), global_config=None, secrets=None, allow=False):
    return am.secret_problems(global_config or {}, list(receivers), secrets or {}, DIR, allow)


def receiver(integration, entry):
    return [{"name": "r", integration: [entry]}]


# every integration key Alertmanager 0.33.1 types Secret/SecretURL/SecretTemplateURL, with its file twin
INLINE = [(integration, key, twin) for integration, keys in sorted(am.INTEGRATION_SECRETS.items())
          for key, twin in sorted(keys.items())]


def test_the_table_covers_every_receiver_type_of_alertmanager_0_33():
    assert set(am.INTEGRATION_SECRETS) == {
        "discord_configs", "email_configs", "incidentio_configs", "pagerduty_configs", "slack_configs",
        "webhook_configs", "opsgenie_configs", "wechat_configs", "pushover_configs", "victorops_configs",
        "sns_configs", "telegram_configs", "webex_configs", "msteams_configs", "msteamsv2_configs", "jira_configs",
        "rocketchat_configs", "mattermost_configs"}
    assert len(INLINE) == 20


@pytest.mark.parametrize("integration,key,twin", INLINE)
def test_inline_secret_of_each_receiver_type_is_refused_naming_its_file_twin(integration, key, twin):
    found = problems(receiver(integration, {key: VALUE, "send_resolved": True}))
    assert found == ["alertmanager_receivers[0] (r) %s[0]: %s is a secret written inline; put its value in "
                     "alertmanager_secrets (from a vault) and set %s: \"{{ alertmanager_secrets_dir }}/<secret name>\" "
                     "instead" % (integration, key, twin)]
    assert problems(receiver(integration, {twin: DIR + "/x"}), secrets={"x": VALUE}) == []


@pytest.mark.parametrize("integration,key,twin", INLINE)
def test_inline_secret_with_a_file_twin_stays_refused_with_the_opt_in(integration, key, twin):
    assert len(problems(receiver(integration, {key: VALUE}), allow=True)) == 1


def test_slack_style_webhook_url_without_query_is_refused():
    # the token is in the path: nothing in the URL tells it from a harmless one
    found = problems(receiver("webhook_configs", {"url": "https://hooks.example/services/T0/B0/" + VALUE}))
    assert "url is a secret written inline" in found[0] and "url_file" in found[0]


@pytest.mark.parametrize("key,twin", sorted(am.GLOBAL_SECRETS.items()))
def test_global_secrets_are_refused(key, twin):
    found = problems(global_config={key: VALUE, "smtp_from": "a@b"})
    assert found == ["alertmanager_global: %s is a secret written inline; put its value in alertmanager_secrets (from "
                     "a vault) and set %s: \"{{ alertmanager_secrets_dir }}/<secret name>\" instead" % (key, twin)]


@pytest.mark.parametrize("http_config,where,twin", [
    ({"basic_auth": {"username": "u", "password": VALUE}}, "http_config.basic_auth: password", "password_file"),
    ({"authorization": {"credentials": VALUE}}, "http_config.authorization: credentials", "credentials_file"),
    ({"bearer_token": VALUE}, "http_config: bearer_token", "bearer_token_file"),
    ({"oauth2": {"client_id": "c", "client_secret": VALUE}}, "http_config.oauth2: client_secret",
     "client_secret_file"),
    ({"tls_config": {"cert_file": "/c", "key": VALUE}}, "http_config.tls_config: key", "key_file"),
])
def test_http_config_secrets_are_refused_in_receivers_and_global(http_config, where, twin):
    for integration in ("webhook_configs", "webex_configs", "jira_configs"):
        found = problems(receiver(integration, {"http_config": http_config}))
        assert found == ["alertmanager_receivers[0] (r) %s[0].%s is a secret written inline; put its value in "
                         "alertmanager_secrets (from a vault) and set %s: \"{{ alertmanager_secrets_dir }}/<secret "
                         "name>\" instead" % (integration, where, twin)]
    assert len(problems(global_config={"http_config": http_config})) == 1


def test_secrets_without_a_file_variant_need_the_opt_in():
    sns = receiver("sns_configs", {"topic_arn": "arn:x", "sigv4": {"region": "eu", "access_key": "AKIA",
                                                                    "secret_key": VALUE}})
    found = problems(sns)
    assert len(found) == 1 and "sigv4: secret_key is a secret written inline; Alertmanager has no file variant" \
        in found[0] and "sigv4.profile" in found[0] and "alertmanager_allow_inline_secrets: true" in found[0]
    assert problems(sns, allow=True) == []
    proxy = receiver("webhook_configs", {"url_file": DIR + "/w",
                                         "http_config": {"proxy_connect_header": {"Proxy-Authorization": [VALUE]}}})
    assert "proxy_connect_header holds secrets written inline" in problems(proxy, secrets={"w": "x"})[0]
    assert problems(proxy, secrets={"w": "x"}, allow=True) == []


def test_url_with_credentials_or_query_in_a_key_without_twin_needs_the_opt_in():
    for url in ("https://user:" + VALUE + "@jira.example/", "https://jira.example/rest?token=" + VALUE):
        found = problems(receiver("jira_configs", {"api_url": url, "project": "OPS"}))
        assert len(found) == 1 and "api_url holds credentials or a query string" in found[0]
        assert problems(receiver("jira_configs", {"api_url": url, "project": "OPS"}), allow=True) == []
    assert problems(receiver("jira_configs", {"api_url": "https://jira.example/rest/api/2/", "project": "O"})) == []


def test_unknown_secret_shaped_keys_are_refused():
    found = problems(receiver("newchat_configs", {"api_token": VALUE, "room": "x"}))
    assert len(found) == 1 and "api_token looks like a secret" in found[0] and "api_token_file" in found[0]
    found = problems(receiver("email_configs", {"to": "a@b", "tls_config": {"key": VALUE}}))
    assert "email_configs[0].tls_config: key looks like a secret" in found[0]


def test_plain_strings_shaped_like_secrets_upstream_types_as_plain_pass():
    assert problems(receiver("victorops_configs", {"api_key_file": DIR + "/v", "routing_key": "team-gpu"}),
                    secrets={"v": VALUE}) == []


def test_no_message_ever_holds_a_value():
    receivers = [{"name": "all", **{integration: [{key: VALUE + integration}]} } for integration, key, _ in INLINE]
    found = problems(receivers, global_config={k: VALUE for k in am.GLOBAL_SECRETS})
    assert len(found) == len(INLINE) + len(am.GLOBAL_SECRETS)
    assert not any(VALUE in p for p in found)


def test_referenced_secret_files_must_be_listed_and_named_safely():
    refs = receiver("webhook_configs", {"url_file": DIR + "/pager"})
    assert problems(refs) == ["secret files referred to but not in alertmanager_secrets: pager"]
    assert problems(refs, secrets={"pager": "x"}) == []
    assert problems(secrets={"../x": "v"}) == ['alertmanager_secrets: "../x" is not a file name ([A-Za-z0-9]'
                                               '[A-Za-z0-9_.-]*)']
    assert problems(secrets={"n": 5}) == ["alertmanager_secrets: the value of n is not a string"]


def test_receivers_without_integrations_and_plain_settings_pass():
    assert problems([{"name": "oncall"}, {"name": "ops", "email_configs": [{"to": "a@b", "send_resolved": True,
                                                                           "auth_username": "gpu"}]}],
                    global_config={"smtp_smarthost": "m:587", "resolve_timeout": "5m",
                                   "slack_api_url_file": DIR + "/s"}, secrets={"s": "x"}) == []
