"""The vmalert role's meta/argument_specs.yml lists every variable of defaults/main/ (service and rule settings)
with its default, and defaults/main/main.yml repeats no key of defaults/main/rules.yml (the files load in order,
a repeated key would silently win)."""
from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[1] / "roles" / "vmalert"


def test_service_defaults_do_not_repeat_rule_defaults():
    service = yaml.safe_load((ROLE / "defaults" / "main" / "main.yml").read_text())
    rules = yaml.safe_load((ROLE / "defaults" / "main" / "rules.yml").read_text())
    assert set(service) & set(rules) == set()
    assert "vmalert_rules_dir" in service and "vmalert_rules_validate_command" in service


def test_argument_specs_match_the_defaults():
    defaults = {}
    for path in sorted((ROLE / "defaults" / "main").glob("*.yml")):
        defaults.update(yaml.safe_load(path.read_text()))
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults)
    for name, spec in options.items():
        assert spec["default"] == defaults[name], name
        assert spec.get("description"), name
