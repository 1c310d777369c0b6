"""The load generator's machinery, shared by every serving scenario: the server as a process, the
client, request shapes, closed-loop runs, statistics, process CPU and reports."""
