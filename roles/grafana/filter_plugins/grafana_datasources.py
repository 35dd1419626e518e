"""Filters of the grafana role for the datasources it provisions, when the components they read are secured by the
site's security switch (hpcobs_security; files/components.yml `tls: true`; README.md "Security model").

A datasource of a secured component gets the keys of Grafana's datasource provisioning (Grafana 12,
docs/sources/administration/provisioning): `basicAuth`, `basicAuthUser`, `jsonData.tlsAuthWithCACert`, and in
`secureJsonData` (encrypted into Grafana's database with security.secret_key) `basicAuthPassword` and `tlsCACert`.
Their values are `$__file{<path>}` references, not the secrets: Grafana expands the settings file's expanders in
every provisioned value (pkg/services/provisioning/values/values.go, interpolateValue -> setting.ExpandVar; the file
expander reads the file and trims white space), so the credential stays in its file (roles/service tasks_from: tls,
0640 root:grafana) and the provisioning file holds no secret of the role's.

grafana_secure_datasources: every datasource of a component in `secured` gets the client user, the component's
client credential file (<tls_dir>/<component>-client, roles/pki) and the site CA file (<tls_dir>/ca.crt). One generic
rule for VictoriaMetrics, Loki and Alertmanager alike: a component becomes secured by its `tls: true` in the
components map, nothing here changes.
grafana_datasources_tls_problem: what cannot work (an http:// URL for a component served over https only), for the
preflight, before anything changes.
grafana_datasource_credentials: the credential names those datasources need (what the role installs).
"""

from __future__ import annotations

import copy

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used outside Ansible (unit tests)
    AnsibleFilterError = ValueError


def _secured_entries(datasources, component_of, secured):
    for datasource in datasources or []:
        component = (component_of or {}).get(datasource.get("uid"))
        if component and component in (secured or []):
            yield datasource, component


def datasources_tls_problem(datasources, component_of, secured):
    """'' when every datasource of a secured component reaches it at an https:// URL, else what is wrong."""
    wrong = ["%s (%s) at %s" % (datasource.get("name"), component, datasource.get("url"))
             for datasource, component in _secured_entries(datasources, component_of, secured)
             if not str(datasource.get("url") or "").startswith("https://")]
    if wrong:
        return ("hpcobs_security is on and these components serve only HTTPS, but Grafana's datasource would reach "
                "them over plain HTTP: %s. Leave the grafana_*_url setting at its default, or give an https:// URL"
                % "; ".join(wrong))
    return ""


def datasource_credentials(datasources, component_of, secured):
    """The credential names (<component>-client) the datasources of secured components read, each once."""
    out = []
    for _, component in _secured_entries(datasources, component_of, secured):
        if component + "-client" not in out:
            out.append(component + "-client")
    return out


def secure_datasources(datasources, component_of, secured, user, tls_dir):
    """The datasources, each one of a secured component with basic auth as `user` (its password read by Grafana from
    <tls_dir>/<component>-client) and TLS verified against the site CA (<tls_dir>/ca.crt); the others as they are.
    Raises what datasources_tls_problem finds (the provisioning would not work)."""
    problem = datasources_tls_problem(datasources, component_of, secured)
    if problem:
        raise AnsibleFilterError(problem)
    tls_dir = str(tls_dir or "").rstrip("/")
    if not tls_dir.startswith("/") or any(char in tls_dir for char in "{}$\n"):
        raise AnsibleFilterError("the TLS directory of the datasources must be an absolute path, got %r" % (tls_dir,))
    secured_ids = {id(ds): component for ds, component in _secured_entries(datasources, component_of, secured)}
    out = []
    for datasource in datasources or []:
        component = secured_ids.get(id(datasource))
        if component is None:
            out.append(datasource)
            continue
        entry = copy.deepcopy(datasource)
        entry.update({"basicAuth": True, "basicAuthUser": str(user)})
        entry["jsonData"] = dict(entry.get("jsonData") or {}, tlsAuthWithCACert=True)
        entry["secureJsonData"] = dict(entry.get("secureJsonData") or {},
                                       basicAuthPassword="$__file{%s/%s-client}" % (tls_dir, component),
                                       tlsCACert="$__file{%s/ca.crt}" % tls_dir)
        out.append(entry)
    return out


class FilterModule:
    def filters(self):
        return {
            "grafana_datasource_credentials": datasource_credentials,
            "grafana_datasources_tls_problem": datasources_tls_problem,
            "grafana_secure_datasources": secure_datasources,
        }
