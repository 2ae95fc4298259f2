"""The Triton KV-cache store (store.py), vLLM's reshape_and_cache.
"""
