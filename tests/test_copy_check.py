"""scripts/copy-check.py: copied tasks and unit lines across roles, found on small role trees built here."""
import importlib.util
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("copy_check", os.path.join(ROOT, "scripts", "copy-check.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

PREFLIGHT = """---
- name: Check the settings of {role}
  ansible.builtin.assert:
    that: {role}_ready_timeout > 0
    fail_msg: "{role}: bad"
  tags: [{role}, "{role}:preflight"]
"""


def write(root, path, text):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)


def config(tmp_path, tasks=0, unit_lines=0, shared=("service",)):
    path = tmp_path / "copy-check.yml"
    path.write_text(yaml.safe_dump({"ceiling": {"tasks": tasks, "unit_lines": unit_lines},
                                    "shared_roles": list(shared)}))
    return str(path)


def test_a_task_copied_with_the_role_name_swapped_counts_in_both_roles(tmp_path):
    for role in ("alpha", "beta_exporter"):
        write(tmp_path, "roles/%s/tasks/preflight.yml" % role, PREFLIGHT.format(role=role))
    write(tmp_path, "roles/gamma/tasks/main.yml", "---\n- name: Something else\n  ansible.builtin.debug:\n"
                                                   "    msg: gamma\n")
    result = check.measure(str(tmp_path / "roles"), ["service"])
    assert result["tasks_total"] == 3
    assert sorted(path for path, _ in result["tasks"]) == ["alpha/tasks/preflight.yml",
                                                           "beta_exporter/tasks/preflight.yml"]


def test_the_name_is_swapped_only_as_a_whole_word(tmp_path):
    # "beta" inside "alphabetal" is not the role's name: the two tasks differ.
    write(tmp_path, "roles/alpha/tasks/main.yml", "---\n- name: x\n  ansible.builtin.debug:\n    msg: alphabetal\n")
    write(tmp_path, "roles/beta/tasks/main.yml", "---\n- name: x\n  ansible.builtin.debug:\n    msg: alphabetal\n")
    write(tmp_path, "roles/gamma/tasks/main.yml", "---\n- name: x\n  ansible.builtin.debug:\n    msg: gammabetal\n")
    result = check.measure(str(tmp_path / "roles"), [])
    assert sorted(path for path, _ in result["tasks"]) == ["alpha/tasks/main.yml", "beta/tasks/main.yml"]


def test_tasks_inside_blocks_and_handlers_count_one_by_one(tmp_path):
    block = "---\n- name: A block\n  block:\n    - name: one\n      ansible.builtin.debug:\n        msg: 1\n" \
            "    - name: two {role}\n      ansible.builtin.debug:\n        msg: 2\n"
    for role in ("alpha", "beta"):
        write(tmp_path, "roles/%s/handlers/main.yml" % role, block.format(role=role))
    write(tmp_path, "roles/beta/handlers/other.yml", "---\n- name: one\n  ansible.builtin.debug:\n    msg: 3\n")
    result = check.measure(str(tmp_path / "roles"), [])
    assert result["tasks_total"] == 5
    assert len(result["tasks"]) == 4


def test_calling_a_shared_role_is_not_a_copy_and_the_shared_role_is_not_compared(tmp_path):
    call = "---\n- name: Unit\n  ansible.builtin.import_role:\n    name: service\n    tasks_from: unit\n" \
           "  vars:\n    service_name: {role}\n"
    for role in ("alpha", "beta"):
        write(tmp_path, "roles/%s/tasks/main.yml" % role, call.format(role=role))
        write(tmp_path, "roles/service/tasks/%s.yml" % role, PREFLIGHT.format(role="x"))
    result = check.measure(str(tmp_path / "roles"), ["service"])
    assert result["tasks"] == [] and result["tasks_total"] == 0
    # Without "service" among the shared roles both calls are copies (its own two equal tasks are one role's).
    assert sorted(path for path, _ in check.measure(str(tmp_path / "roles"), [])["tasks"]) == \
        ["alpha/tasks/main.yml", "beta/tasks/main.yml"]


def test_a_handler_including_a_task_file_of_a_shared_role_is_a_call(tmp_path):
    handler = "---\n- name: Restart {role}\n  ansible.builtin.include_tasks: \"{{{{ role_path }}}}/../service/tasks/" \
              "restart.yml\"\n  vars:\n    service_unit: {role}.service\n" \
              "- name: Local {role}\n  ansible.builtin.debug:\n    msg: {role}\n"
    for role in ("alpha", "beta"):
        write(tmp_path, "roles/%s/handlers/main.yml" % role, handler.format(role=role))
    result = check.measure(str(tmp_path / "roles"), ["service"])
    assert result["tasks_total"] == 2
    assert sorted(name for _, name in result["tasks"]) == ["Local alpha", "Local beta"]


def test_phase_imports_of_a_roles_own_files_are_not_copies_unless_all_is_asked(tmp_path):
    main = "---\n- name: Preflight\n  ansible.builtin.import_tasks: preflight.yml\n  tags: [{role}, \"{role}:preflight\"]\n"
    for role in ("alpha", "beta"):
        write(tmp_path, "roles/%s/tasks/main.yml" % role, main.format(role=role))
    assert check.measure(str(tmp_path / "roles"), [])["tasks"] == []
    assert len(check.measure(str(tmp_path / "roles"), [], count_calls=True)["tasks"]) == 2
    # a path into another role is not the role's own file
    other = "---\n- name: Other\n  ansible.builtin.import_tasks: ../../gamma/tasks/x.yml\n"
    for role in ("alpha", "beta"):
        write(tmp_path, "roles/%s/tasks/other.yml" % role, other)
    assert len(check.measure(str(tmp_path / "roles"), [])["tasks"]) == 2


def test_unit_lines_shared_by_two_roles_count_comments_and_blanks_do_not(tmp_path):
    unit = "# {{{{ ansible_managed }}}}\n[Service]\nUser={role}\n\nNoNewPrivileges=yes\nExecStart=/bin/{role} --{own}\n"
    write(tmp_path, "roles/alpha/templates/alpha.service.j2", unit.format(role="alpha", own="a"))
    write(tmp_path, "roles/beta/templates/beta.service.j2", unit.format(role="beta", own="b"))
    result = check.measure(str(tmp_path / "roles"), [])
    assert result["unit_lines_total"] == 8
    assert sorted(line for _, line in result["unit_lines"]) == ["NoNewPrivileges=yes"] * 2 + ["User=ROLE"] * 2 \
        + ["[Service]"] * 2


def test_main_fails_above_the_ceiling_and_names_the_copies(tmp_path, capsys):
    for role in ("alpha", "beta"):
        write(tmp_path, "roles/%s/tasks/preflight.yml" % role, PREFLIGHT.format(role=role))
    roles = str(tmp_path / "roles")
    assert check.main(["--roles", roles, "--config", config(tmp_path, tasks=1)]) == 1
    out = capsys.readouterr().out
    assert "2 of 2 tasks/handlers are copies (ceiling 1): ABOVE THE CEILING" in out
    assert "alpha/tasks/preflight.yml: Check the settings of alpha" in out
    assert check.main(["--roles", roles, "--config", config(tmp_path, tasks=2)]) == 0


def test_a_ceiling_that_is_not_a_number_is_refused(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("ceiling: {tasks: many, unit_lines: 3}\n")
    with pytest.raises(SystemExit, match="ceiling.tasks must be an integer"):
        check.load_config(str(path))


def test_the_repository_is_within_its_ceilings():
    assert check.main([]) == 0
