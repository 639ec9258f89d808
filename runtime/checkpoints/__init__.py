"""Sharded checkpoints: save, agree and load at any world size or stage; resume; export."""
