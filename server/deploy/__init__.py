"""Deploying silofl on Flower's deployment runtime: certificates and keys (`certs`), a loopback federation of
real SuperLink/SuperNode processes (`local`), and the `silofl deploy` commands (`cli`). See docs/DEPLOYMENT.md."""
