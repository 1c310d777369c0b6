"""A simulator of Prelude replicas behind a router, its model of step costs, and the command that
measures those costs on a real server."""
