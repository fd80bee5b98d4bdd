"""The one exception the converter raises for bad input."""


class ConvertError(ValueError):
    """The source checkpoint or an argument cannot be converted; the message says what and where."""
