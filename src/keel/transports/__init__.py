"""Model transports, one file per wire protocol, and what they share.

`base` declares the `Transport` protocol and the optional capabilities (`Resumable`,
`LocalModel`); `policy` is the provider policy every transport applies to a failure (retryable
statuses, Retry-After, key scrubbing, exception chaining). Each module names its public
members in ``__all__``; the package itself exports nothing, so importing it loads no SDK.
"""

__all__: list[str] = []
