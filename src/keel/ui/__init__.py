"""`keel ui`: a local web view of a store's runs (`pip install 'keel-runtime[ui]'`).

Nothing here is imported by `import keel`; `keel ui` imports the web libraries when it runs.
"""

__all__: list[str] = []
