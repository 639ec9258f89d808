"""The client side: the modules that talk to the API server (transport: the connection, retries and watches;
kube: the verbs, apply and Events), its connection and request budget, the informer cache (reflector, cache,
cached_client), the resync, the pod-create pool, leader election and Events.

The rule to learn first: watches fill the cache, the cache's changes feed the work queue, and a pass reads the
cache (a LIST only where the cache does not yet hold a job's complete set of pods).
"""
