"""Kubernetes adapters: the API client, watch caches, conversion to the model, plan apply and
leader election. ``convert`` is pure; the other modules talk to the API server through
``client.Kube``, the one place where HTTP errors become ``RetryableError``/``PermanentError``.
"""
