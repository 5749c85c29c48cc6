"""A small public-domain English text for perplexity on real checkpoints.

US government works of the 18th and 19th centuries, in the public domain: the
Preamble to the Constitution of the United States (1787), the opening of the
Declaration of Independence (1776) and the Gettysburg Address (Abraham Lincoln,
1863, the Bliss copy). Fixed forever, so perplexities of different runs, tools
and precisions are comparable.
"""

from __future__ import annotations

PUBLIC_DOMAIN_TEXT = """\
We the People of the United States, in Order to form a more perfect Union, establish \
Justice, insure domestic Tranquility, provide for the common defence, promote the general \
Welfare, and secure the Blessings of Liberty to ourselves and our Posterity, do ordain and \
establish this Constitution for the United States of America.

When in the Course of human events, it becomes necessary for one people to dissolve the \
political bands which have connected them with another, and to assume among the powers of \
the earth, the separate and equal station to which the Laws of Nature and of Nature's God \
entitle them, a decent respect to the opinions of mankind requires that they should declare \
the causes which impel them to the separation.

We hold these truths to be self-evident, that all men are created equal, that they are \
endowed by their Creator with certain unalienable Rights, that among these are Life, Liberty \
and the pursuit of Happiness. That to secure these rights, Governments are instituted among \
Men, deriving their just powers from the consent of the governed.

Four score and seven years ago our fathers brought forth on this continent, a new nation, \
conceived in Liberty, and dedicated to the proposition that all men are created equal.

Now we are engaged in a great civil war, testing whether that nation, or any nation so \
conceived and so dedicated, can long endure. We are met on a great battle-field of that war. \
We have come to dedicate a portion of that field, as a final resting place for those who \
here gave their lives that that nation might live. It is altogether fitting and proper that \
we should do this.

But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- \
this ground. The brave men, living and dead, who struggled here, have consecrated it, far \
above our poor power to add or detract. The world will little note, nor long remember what \
we say here, but it can never forget what they did here. It is for us the living, rather, to \
be dedicated here to the unfinished work which they who fought here have thus far so nobly \
advanced. It is rather for us to be here dedicated to the great task remaining before us -- \
that from these honored dead we take increased devotion to that cause for which they gave \
the last full measure of devotion -- that we here highly resolve that these dead shall not \
have died in vain -- that this nation, under God, shall have a new birth of freedom -- and \
that government of the people, by the people, for the people, shall not perish from the earth.
"""
