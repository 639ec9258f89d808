"""A job's children: their pure builders, names and labels, the user's pod template and Kueue's labels."""
