"""The client side: the one module that talks to the API server (kube), its connection and request budget, the
informer cache (reflector, cache, cached_client), the resync, the pod-create pool, leader election and Events."""
