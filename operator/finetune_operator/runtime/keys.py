"""The key every piece of the runtime files a FineTuneJob under: (namespace, name).

Not the uid: a job deleted and re-created under its name is the same work item (its children carry the
name in a label, and the reconcile tells the two apart by the owner uid).
"""

Key = tuple[str, str]
