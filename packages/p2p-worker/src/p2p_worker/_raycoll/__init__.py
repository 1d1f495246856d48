"""The engine behind :mod:`p2p_worker.compat`, the drop-in for ``ray.util.collective``.

Private: import the public names from :mod:`p2p_worker.compat`. One concept per module:
errors (``_errors``), argument checks in Ray's terms (``_checks``), the rendezvous found
through Ray (``_service``), where a process meets its peers (``_env``), one member's
group (``_group``) and this process's table of groups (``_registry``).
"""
