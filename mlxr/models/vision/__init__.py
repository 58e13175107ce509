"""Vision towers shared by the vision-language models (SigLIP; CLIP differs in little)."""
