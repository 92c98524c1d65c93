"""holedger.server."""

# The most attempts one evaluation request may ask for (each is a trial per case): no
# budget holds that many. Here, not in service.py, so the command line can name it without
# importing the server.
MAX_ATTEMPTS = 10_000
