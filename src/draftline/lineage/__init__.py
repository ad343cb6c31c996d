"""What an artifact was made from: content hashes of inputs (`content_hash`), the shared cache of a
big target's file hashes (`target_hash_cache`), provenance.json and the lineage (`provenance`) and
the installed packages' versions (`versions`)."""
