"""The release, in its own module so that the stages that print it (reports, metrics, the CLI, the
User-Agent of posts) never import the package's public face, which imports them."""

__version__ = "0.1.0"
