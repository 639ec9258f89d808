"""The controller: one pass per job (reconcile) through admission, the observed pods, the pure status and its
conditions, resizes and start-up reports."""
