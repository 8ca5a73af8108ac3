"""The worker daemon: serves masters, holds their sessions, runs their streams."""
