"""The lean eager path: kernel launches replayed from C++ rather than through Python."""
