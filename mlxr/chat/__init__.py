"""Chat as text: rendering a model's chat template in a sandbox (template.py under the budget of
template_limits.py), the tool-call formats families write calls in (tools/) and the reasoning
markers that set thinking apart from the reply (reasoning.py). Pure text: no torch, engine,
loader or server."""
