"""The in-container agent, a standard-library-only package shipped into the image as one zipapp.

Only ``wire`` is imported by the host; the other modules run inside the
container. See ``supervisor`` for the design.
"""
