"""The platform layer: where pools come from and where the policy's commands land.

``contract.py`` is the typed contract with the runtime; ``static.py`` (a pools file) and
``kube/`` (a cluster) implement it; ``hostport.py`` is how both write a member's endpoints.
"""
