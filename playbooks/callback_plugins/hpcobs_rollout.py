"""Callback: at the end of a run, name every host that was not deployed, and why.

A staged rollout (serial batches with a canary and max_fail_percentage, management hosts one at a time) stops part
way on purpose, and Ansible then skips the rest of the run without a word about the hosts it never reached. This
callback prints, after the recap, one block "NOT DEPLOYED" with:
  - each host that failed (first failed task and its message) or was unreachable;
  - each host of a batch that Ansible stopped part way because the batch's failed share went beyond
    max_fail_percentage (the host itself did not fail), with the task it stopped at;
  - each host a play was meant to reach but never did (the play stopped after a failed batch, a failed canary or an
    earlier play stopped the run), with the first such play.
Enabled in ansible.cfg (callbacks_enabled = hpcobs_rollout); it changes nothing and prints nothing else.
"""

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: hpcobs_rollout
type: aggregate
short_description: Name the hosts a run did not deploy (failed, unreachable, never reached)
description:
  - Prints after the play recap the hosts that failed, were unreachable, or were never reached because a staged
    rollout stopped (serial batches, canary, max_fail_percentage).
requirements: [enable in ansible.cfg callbacks_enabled]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hpcobs_rollout"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.planned = []  # [(play name, play uuid, [hosts])] in playbook order
        self.reached = {}  # play uuid -> hosts of the batches that started
        self.problems = {}  # host -> first reason
        self.stopped = {}  # host -> where its batch was stopped (it did not fail itself)
        self.play = None
        self.batch = []  # the hosts of the current serial batch
        self.task = ""
        self.inventory = None

    @staticmethod
    def _hosts(inventory, pattern):
        try:
            return [h.name for h in inventory.get_hosts(pattern)]
        except Exception:  # noqa: BLE001 - a pattern that does not resolve plans nothing
            return []

    def v2_playbook_on_start(self, playbook):
        self.planned = []
        for play in playbook.get_plays():
            manager = getattr(play, "_variable_manager", None)
            inventory = getattr(manager, "_inventory", None)
            if inventory is None:
                continue
            self.inventory = inventory
            self.planned.append((play.get_name(), play._uuid, play.hosts))

    def v2_playbook_on_play_start(self, play):
        manager = getattr(play, "_variable_manager", None)
        inventory = getattr(manager, "_inventory", None)
        self.play = play
        self.batch = []
        if inventory is not None:
            # the inventory is restricted to the current serial batch here
            self.batch = self._hosts(inventory, play.hosts)
            self.reached.setdefault(play._uuid, set()).update(self.batch)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.task = task.get_name()

    def v2_playbook_on_no_hosts_remaining(self):
        # Ansible stops a whole batch (linear strategy) once its failed share passes max_fail_percentage: the batch's
        # other hosts end the play part way, counted as neither failed nor unreachable in the stats.
        if self.play is not None:
            for host in self.batch:
                if host not in self.problems:
                    self.stopped.setdefault(host, "stopped in task [%s] of play [%s]: its batch's failed share went beyond "
                                                  "max_fail_percentage" % (self.task, self.play.get_name()))

    def _note(self, result, kind):
        host = result._host.get_name()
        if host in self.problems:
            return
        message = str(result._result.get("msg") or result._result.get("stderr") or "").strip().splitlines()
        self.problems[host] = "%s in task [%s]%s" % (kind, result._task.get_name(),
                                                     (": " + message[0][:300]) if message else "")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self._note(result, "failed")

    def v2_runner_on_unreachable(self, result):
        self._note(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        # a failure that a block rescued is not counted by Ansible's stats, and is not one here
        failed = {h for h in self.problems if stats.failures.get(h, 0) or stats.dark.get(h, 0)}
        self.problems = {h: reason for h, reason in self.problems.items() if h in failed}
        lines = []
        for host in sorted(self.problems):
            lines.append("  %s: %s" % (host, self.problems[host]))
        for host in sorted(set(self.stopped) - set(self.problems)):
            lines.append("  %s: %s" % (host, self.stopped[host]))
        unreached = {}
        if self.inventory is not None:
            self.inventory.remove_restriction()
            for name, uuid, pattern in self.planned:
                for host in self._hosts(self.inventory, pattern):
                    if host not in self.problems and host not in self.stopped and host not in self.reached.get(uuid, set()):
                        unreached.setdefault(host, name)
        for host in sorted(unreached):
            lines.append("  %s: never reached by play [%s] (the run stopped before it: a failed canary or batch "
                         "beyond max_fail_percentage, or an earlier play)" % (host, unreached[host]))
        if lines:
            self._display.display("\nNOT DEPLOYED (%d host%s): re-run once the cause is fixed\n%s"
                                  % (len(lines), "" if len(lines) == 1 else "s", "\n".join(lines)), stderr=True)
