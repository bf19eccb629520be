"""Questions asked of cube samples, shared by the families that answer them (vqa: generative
models; heads: encoders with linear heads): the task catalog (`tasks`), the questions of a cube
(`ask`), answer parsers (`parsers`), answer metrics (`metrics`) and the board cells (`cells`)."""
