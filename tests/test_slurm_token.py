"""slurmctld's metrics behind MetricsAuthUsers: the controller's decision (roles/slurm_metrics hpcobs_slurm_native_plan)
and the Slurm JWT VictoriaMetrics presents (playbooks/filter_plugins/hpcobs_service.py hpcobs_slurm_token_*)."""
import base64
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


service = _load("hpcobs_service", "playbooks", "filter_plugins", "hpcobs_service.py")
slurm = _load("hpcobs_slurm_metrics", "roles", "slurm_metrics", "filter_plugins", "hpcobs_slurm_metrics.py")
NOW = 1_800_000_000
GPU = ["GresTypes=gpu", "AccountingStorageTRES=gres/gpu"]


def jwt(claims, header=None):
    def part(obj):
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return "%s.%s.%s" % (part(header or {"alg": "HS256", "typ": "JWT"}), part(claims), "c2lnbmF0dXJl")


def slurped(token):
    return {"content": base64.b64encode(token.encode()).decode(), "encoding": "base64"}


# --- the controller's decision ---------------------------------------------------------------------------------

@pytest.mark.parametrize("conf,user,on,token,blocked", [
    (GPU, "", True, "", ""),
    (GPU + ["MetricsAuthUsers=hpcobs-metrics", "AuthAltTypes=auth/jwt"], "", True, "hpcobs-metrics", ""),
    (GPU + ["MetricsAuthUsers=a,b", "AuthAltTypes=auth/jwt"], "b", True, "b", ""),
    (GPU + ["MetricsAuthUsers = a , b ", "AuthAltTypes = auth/munge, auth/jwt"], "", True, "a", ""),
    (GPU + ["MetricsAuthUsers=hpcobs-metrics"], "", False, "", "has no AuthAltTypes=auth/jwt"),
    (GPU + ["MetricsAuthUsers=x", "AuthAltTypes=auth/jwt", "MetricsAuthUsers=y"], "", True, "y", ""),  # last wins
    (GPU + ["PrivateData=jobs", "AuthAltTypes=auth/jwt"], "", False, "", "never mints"),
    (GPU + ["PrivateData=jobs", "MetricsParameters=ignore_private_data"], "", True, "", ""),
    (GPU + ["AuthAltTypes=auth/jwt"], "", True, "", ""),  # nothing asks for a token: none is minted
    (["GresTypes=gpu"], "", False, "", ""),                # GPUs not tracked as a TRES
])
def test_native_plan(conf, user, on, token, blocked):
    plan = slurm.native_plan(conf, "slurm 26.05.5", "auto", user)
    assert (plan["on"], plan["token_user"], plan["problem"]) == (on, token, "")
    assert (blocked in plan["blocked"]) if blocked else plan["blocked"] == ""


def test_native_plan_versions_and_modes():
    assert slurm.native_plan(GPU, "slurm 25.11.0", "auto")["on"] is True
    assert slurm.native_plan(GPU, "slurm 24.11.5", "auto") | {} == {
        "version": "24.11.5", "capable": False, "on": False, "token_user": "", "blocked": "", "gpu_blind": False,
        "problem": ""}
    assert slurm.native_plan(GPU, "", "auto")["version"] == "0"
    assert slurm.native_plan(GPU, "slurm 26.05.5", "false")["on"] is False
    # true: on whatever it finds (the preflight's assert then refuses what cannot work)
    forced = slurm.native_plan(GPU + ["MetricsAuthUsers=m"], "slurm 26.05.5", "true")
    assert forced["on"] is True and forced["blocked"] and forced["token_user"] == ""
    assert slurm.native_plan(GPU + ["MetricsAuthUsers=m", "AuthAltTypes=auth/jwt"], "26.05.5", "True")["token_user"] == "m"


def test_native_plan_without_slurmctlds_http_jwt_plugin_keeps_the_collector():
    conf = GPU + ["MetricsAuthUsers=m", "AuthAltTypes=auth/jwt"]
    plan = slurm.native_plan(conf, "slurm 26.05.5", "auto", "", http_jwt=False)
    assert plan["on"] is False and plan["token_user"] == "" and "http_auth_jwt.so" in plan["blocked"]
    # nothing asks for a token: the plugin does not matter
    assert slurm.native_plan(GPU, "slurm 26.05.5", "auto", "", http_jwt=False)["on"] is True


@pytest.mark.parametrize("user,says", [
    ("root", "root is not in slurm.conf's MetricsAuthUsers=m"),
    ("m;id", "must be a user name"),
    ("m\nx", "must be a user name"),
])
def test_native_plan_refuses_a_token_user_it_cannot_use(user, says):
    plan = slurm.native_plan(GPU + ["MetricsAuthUsers=m", "AuthAltTypes=auth/jwt"], "slurm 26.05.5", "auto", user)
    assert says in plan["problem"] and plan["on"] is False


# --- who needs a token -----------------------------------------------------------------------------------------

def _ctl(native=True, user="", this_run=True):
    if this_run:
        return {"slurm_metrics_native_active": native, "slurm_metrics_token_user_active": user}
    return {"ansible_local": {"hpcobs_slurm_metrics": {"native": native, "token_user": user}}}


def test_token_user_from_this_run_or_the_recorded_fact():
    assert service.slurm_token_user(_ctl(True, "m")) == "m"
    assert service.slurm_token_user(_ctl(True, "m", this_run=False)) == "m"
    assert service.slurm_token_user(_ctl(False, "m")) == ""                  # collector: no token
    assert service.slurm_token_user(_ctl(True, "")) == ""
    assert service.slurm_token_user(dict(_ctl(True, "m"), hpcobs_slurm_native_metrics=False)) == ""
    # a fact recorded before tokens existed has no token_user
    assert service.slurm_token_user({"ansible_local": {"hpcobs_slurm_metrics": {"native": True}}}) == ""


def test_token_plan():
    hostvars = {"c1": _ctl(True, "m"), "c2": _ctl(True, "m", this_run=False), "c3": _ctl(True, "")}
    assert service.slurm_token_plan(["c1", "c2", "c3", "gone"], hostvars) == {
        "hosts": ["c1", "c2"], "user": "m", "problem": ""}
    assert service.slurm_token_plan([], hostvars) == {"hosts": [], "user": "", "problem": ""}
    hostvars["c3"] = _ctl(True, "other")
    plan = service.slurm_token_plan(["c1", "c3"], hostvars)
    assert plan["user"] == "" and "c1: m, c3: other" in plan["problem"]


# --- the token itself ------------------------------------------------------------------------------------------

def test_expiry():
    assert service.slurm_token_expiry(jwt({"exp": NOW, "iat": NOW - 10, "sun": "m"})) == NOW
    assert service.slurm_token_expiry(jwt({"exp": NOW}) + "\n") == NOW
    for bad in ["", "not a token", jwt({"iat": NOW}), jwt({"exp": "soon"}), jwt({"exp": True}), "a.b.c", "a.%%%.c",
                jwt(["exp"])]:
        assert service.slurm_token_expiry(bad) == 0, bad


def test_due():
    fresh, ending = jwt({"exp": NOW + 20 * 86400}), jwt({"exp": NOW + 5 * 86400})
    assert service.slurm_token_due([slurped(fresh), slurped(fresh)], 10, now=NOW) is False
    assert service.slurm_token_due([slurped(fresh), slurped(ending)], 10, now=NOW) is True
    assert service.slurm_token_due([slurped(fresh), {"failed": True, "msg": "file not found"}], 10, now=NOW) is True
    assert service.slurm_token_due([slurped(fresh), {"skipped": True}], 10, now=NOW) is True
    assert service.slurm_token_due([slurped("garbage")], 10, now=NOW) is True
    assert service.slurm_token_due([{"content": "%%%"}], 10, now=NOW) is True
    assert service.slurm_token_due([slurped(fresh)], 21, now=NOW) is True


def test_minted():
    token = jwt({"exp": NOW, "sun": "m"})
    assert service.slurm_token_minted("SLURM_JWT=%s\n" % token) == token
    assert service.slurm_token_minted("note: something\nSLURM_JWT=%s\n" % token) == token
    for bad in ["", "SLURM_JWT=", "SLURM_JWT=not-a-jwt", "scontrol: error: Invalid user", token]:
        with pytest.raises(service.AnsibleFilterError, match="printed no SLURM_JWT"):
            service.slurm_token_minted(bad)
