"""The invented world behind the multihop task: people, places and companies, their facts, their passages.

A world is a pure function of `(seed, n_people)`: names come from a syllable generator, every fact is a
functional relation (one value per subject) chosen from the seeded generator, and `render_passages` writes
each entity's facts as 2-4 sentence Wikipedia-style passages whose ids the facts remember, so a question
(built in `drmas.tasks.multihop`) knows which passage supports each of its hops.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional, Sequence

from drmas.retrieval.base import Passage

# --- name generation -------------------------------------------------------------------------------

ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "th", "st")
VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei")
CODAS = ("", "n", "r", "l", "s", "m", "th", "k", "x")  # only after a word's last syllable
CITY_ENDINGS = ("holm", "grad", "ford", "haven", "mere", "stad", "port", "wick", "burg", "dale")
COUNTRY_ENDINGS = ("ia", "land", "ara", "ovia")
LANGUAGE_ENDINGS = ("ish", "ese", "ic", "an")
COMPANY_ENDINGS = ("Works", "Group", "Holdings", "Industries", "Corporation", "Company", "Partners")
UNIVERSITY_FORMS = ("{} University", "{} College", "{} Institute")

# --- attribute vocabularies (real words, so answers read naturally) --------------------------------

INSTRUMENTS = ("violin", "cello", "viola", "harp", "flute", "oboe", "clarinet", "bassoon", "trumpet", "trombone",
               "piano", "accordion", "mandolin", "banjo", "sitar", "saxophone", "marimba", "harpsichord")
OCCUPATIONS = ("engineer", "architect", "accountant", "chemist", "geologist", "translator", "pilot", "lawyer",
               "surveyor", "economist", "designer", "editor", "pharmacist", "cartographer", "statistician",
               "librarian", "veterinarian", "journalist")
INDUSTRIES = ("shipping", "textile", "software", "mining", "publishing", "brewing", "aviation", "pharmaceutical",
              "insurance", "furniture", "railway", "telecommunications")

BIRTH_YEARS = (1935, 2000)
CITY_FOUNDED = (900, 1880)
UNIVERSITY_FOUNDED = (1150, 1990)
LAST_YEAR = 2024


class NameMaker:
    """Invented capitalised words, never the same twice within one world."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()


    def claim(self, word: str) -> bool:
        """Reserve a word built outside `word` (e.g. stem + ending); False when it is already taken."""
        if word.lower() in self._used:
            return False
        self._used.add(word.lower())
        return True

    def word(self, syllables: int, endings: Sequence[str] = ()) -> str:
        """A fresh word of `syllables` syllables, optionally followed by one of `endings`."""
        while True:
            stem = "".join(self._rng.choice(ONSETS) + self._rng.choice(VOWELS) for _ in range(syllables))
            stem += self._rng.choice(CODAS)
            word = (stem + (self._rng.choice(endings) if endings else "")).capitalize()
            if len(word) >= 4 and self.claim(word):
                return word


# --- the world -------------------------------------------------------------------------------------


@dataclass
class Entity:
    """One named thing of the world; `facts` maps a relation name to its value (a name or a literal)."""

    kind: str  # person, city, country, company, university
    name: str
    facts: dict[str, str] = field(default_factory=dict)
    pronoun: str = "it"  # she / he for people
    fact_passage: dict[str, str] = field(default_factory=dict)  # relation -> id of the passage stating it


@dataclass(frozen=True)
class Relation:
    """How a relation is asked about and, when it leads to an entity, how that entity is described."""

    domain: tuple[str, ...]  # kinds of subject that have this relation
    target: Optional[str]  # kind of entity the value names; None for a literal (year, word)
    questions: tuple[str, ...]  # wordings of the question, "{s}" = the subject
    phrases: tuple[str, ...] = ()  # noun phrases for the value as a bridge: "the city where {s} was born"
    one_hop_only: bool = False  # the question names another fact of the subject, so it cannot be nested


RELATIONS: dict[str, Relation] = {
    "born_in": Relation(("person",), "city", ("In which city was {s} born?", "Where was {s} born?"),
                        ("the city where {s} was born", "the birthplace of {s}")),
    "birth_year": Relation(("person",), None, ("In which year was {s} born?", "What year was {s} born in?")),
    "studied_at": Relation(("person",), "university", ("Which university did {s} attend?", "Where did {s} study?"),
                           ("the university {s} attended", "the alma mater of {s}")),
    "instrument": Relation(("person",), None, ("Which instrument does {s} play?", "What instrument does {s} play?")),
    "works_for": Relation(("person",), "company",
                          ("Which company does {s} work for?", "What is the employer of {s}?"),
                          ("the company {s} works for", "the employer of {s}")),
    "occupation": Relation(("person",), None, ("What is the occupation of {s}?", "What does {s} work as?")),
    "joined_year": Relation(("person",), None, ("In which year did {s} join {works_for}?",
                                                "When did {s} start working at {works_for}?"), one_hop_only=True),
    "mentor": Relation(("person",), "person", ("Who mentored {s}?", "Who was the mentor of {s}?"),
                       ("the mentor of {s}", "the person who mentored {s}")),
    "spouse": Relation(("person",), "person", ("Who is {s} married to?", "Who is the spouse of {s}?"),
                       ("the spouse of {s}", "the person {s} is married to")),
    "sibling": Relation(("person",), "person", ("Who is the sibling of {s}?", "Who is the brother or sister of {s}?"),
                        ("the sibling of {s}",)),
    "country": Relation(("city",), "country", ("In which country is {s}?", "In which country is {s} located?"),
                        ("the country where {s} lies",)),
    "mayor": Relation(("city",), "person", ("Who is the mayor of {s}?", "Who serves as mayor of {s}?"),
                      ("the mayor of {s}",)),
    "founded_year": Relation(("city", "company", "university"), None,
                             ("In which year was {s} founded?", "When was {s} founded?")),
    "industry": Relation(("company",), None, ("In which industry does {s} operate?", "What industry is {s} in?")),
    "headquarters": Relation(("company",), "city", ("In which city is {s} headquartered?",
                                                    "Where is {s} headquartered?"),
                             ("the city where {s} is headquartered", "the headquarters city of {s}")),
    "founder": Relation(("company",), "person", ("Who founded {s}?", "Who was the founder of {s}?"),
                        ("the founder of {s}",)),
    "located_in": Relation(("university",), "city", ("In which city is {s} located?", "Where is {s} located?"),
                           ("the city where {s} is located",)),
    "capital": Relation(("country",), "city", ("What is the capital of {s}?", "Which city is the capital of {s}?"),
                        ("the capital of {s}",)),
    "language": Relation(("country",), None, ("What is the official language of {s}?",
                                              "Which language is officially spoken in {s}?")),
}
# Nesting a symmetric relation in itself leads back to the subject.
EXCLUDED_CHAINS = {("spouse", "spouse"), ("sibling", "sibling")}


@dataclass
class World:
    """Every entity by name (names are unique across kinds) and the passages that describe them."""

    entities: dict[str, Entity]
    passages: list[Passage]


def _sizes(n_people: int) -> dict[str, int]:
    """How many places and organisations a world of `n_people` people has."""
    return {
        "country": max(2, n_people // 24),
        "city": max(4, n_people // 6),
        "company": max(3, n_people // 8),
        "university": max(2, n_people // 15),
    }


def _with_article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _make_places(rng: random.Random, names: NameMaker, sizes: dict[str, int]) -> dict[str, Entity]:
    """Countries, cities and universities (no people yet: mayors are set once people exist)."""
    entities: dict[str, Entity] = {}
    countries = []
    while len(countries) < sizes["country"]:
        stem = names.word(2)
        country, language = stem + rng.choice(COUNTRY_ENDINGS), stem + rng.choice(LANGUAGE_ENDINGS)
        if names.claim(country) and names.claim(language):
            countries.append(Entity("country", country, {"language": language}))
    cities = []
    for index in range(sizes["city"]):
        country = countries[index % len(countries)]  # every country gets at least one city
        founded = rng.randint(*CITY_FOUNDED)
        cities.append(Entity("city", names.word(rng.choice((1, 2)), CITY_ENDINGS),
                             {"country": country.name, "founded_year": str(founded)}))
    for country in countries:
        country.facts["capital"] = rng.choice([c for c in cities if c.facts["country"] == country.name]).name
    universities = [
        Entity("university", rng.choice(UNIVERSITY_FORMS).format(names.word(2)),
               {"located_in": rng.choice(cities).name, "founded_year": str(rng.randint(*UNIVERSITY_FOUNDED))})
        for _ in range(sizes["university"])
    ]
    for entity in (*countries, *cities, *universities):
        entities[entity.name] = entity
    return entities


def _pair_up(rng: random.Random, people: list[Entity], n_pairs: int, forbidden: set[frozenset]) -> list[tuple]:
    """Up to `n_pairs` disjoint pairs of people, none of them a `forbidden` pair."""
    order = people[:]
    rng.shuffle(order)
    pairs, free = [], []
    for person in order:
        partner = next((p for p in free if frozenset((p.name, person.name)) not in forbidden), None)
        if partner is not None and len(pairs) < n_pairs:
            free.remove(partner)
            pairs.append((partner, person))
        else:
            free.append(person)
    return pairs


def _make_people(rng: random.Random, names: NameMaker, n_people: int) -> list[Entity]:
    """People with unique full names; siblings share a family name, every other family name is unique."""
    given_pool = [names.word(2) for _ in range(max(6, n_people // 2))]
    n_sibling_pairs = round(0.2 * n_people)
    people: list[Entity] = []
    families: list[int] = []  # family index per person
    for index in range(n_people):
        families.append(index - 1 if index % 2 == 1 and index // 2 < n_sibling_pairs else index)
    family_names: dict[int, str] = {}
    for index, family in enumerate(families):
        if family not in family_names:
            family_names[family] = names.word(rng.choice((2, 3)))
        taken = {p.name.split(" ")[0] for p, f in zip(people, families) if f == family}
        given = rng.choice([g for g in given_pool if g not in taken])
        people.append(Entity("person", f"{given} {family_names[family]}", pronoun=rng.choice(("she", "he"))))
        if family != index:  # the second of a sibling pair
            sibling = people[family]
            people[-1].facts["sibling"], sibling.facts["sibling"] = sibling.name, people[-1].name
    return people


def _assign_person_facts(rng: random.Random, people: list[Entity], entities: dict[str, Entity],
                         companies: list[Entity]) -> None:
    """Birth, studies, work, instrument, mentor and spouse of every person."""
    cities = [e for e in entities.values() if e.kind == "city"]
    universities = [e for e in entities.values() if e.kind == "university"]
    for person in people:
        person.facts.update({
            "birth_year": str(rng.randint(*BIRTH_YEARS)),
            "born_in": rng.choice(cities).name,
            "studied_at": rng.choice(universities).name,
            "instrument": rng.choice(INSTRUMENTS),
            "occupation": rng.choice(OCCUPATIONS),
        })
    related = {frozenset((p.name, p.facts["sibling"])) for p in people if "sibling" in p.facts}
    n_couples = round(0.3 * len(people))
    for a, b in _pair_up(rng, people, n_couples, related):
        a.facts["spouse"], b.facts["spouse"] = b.name, a.name
        related.add(frozenset((a.name, b.name)))
    for person in people:
        year = int(person.facts["birth_year"])
        others = [p for p in people if p is not person and frozenset((p.name, person.name)) not in related]
        elders = [p for p in others if int(p.facts["birth_year"]) <= year - 10]
        person.facts["mentor"] = rng.choice(elders or others).name
    # Companies need founders (people) before people can join them.
    founders = rng.sample(people, len(companies))
    for company, founder in zip(companies, founders):
        company.facts["founder"] = founder.name
        company.facts["founded_year"] = str(min(LAST_YEAR - 2, int(founder.facts["birth_year"]) + rng.randint(22, 40)))
    for person in people:
        company = rng.choice(companies)
        earliest = max(int(person.facts["birth_year"]) + 20, int(company.facts["founded_year"]))
        person.facts["works_for"] = company.name
        person.facts["joined_year"] = str(rng.randint(earliest, LAST_YEAR))


def build_world(seed: int, n_people: int) -> World:
    """The world of `seed` with `n_people` people: entities with their facts, and the passage corpus."""
    rng = random.Random(seed)
    names = NameMaker(rng)
    sizes = _sizes(n_people)
    entities = _make_places(rng, names, sizes)
    cities = [e for e in entities.values() if e.kind == "city"]
    companies = [
        Entity("company", f"{names.word(rng.choice((2, 3)))} {rng.choice(COMPANY_ENDINGS)}",
               {"industry": rng.choice(INDUSTRIES), "headquarters": rng.choice(cities).name})
        for _ in range(sizes["company"])
    ]
    people = _make_people(rng, names, n_people)
    _assign_person_facts(rng, people, entities, companies)
    for city, mayor in zip(cities, rng.sample(people, len(cities))):
        city.facts["mayor"] = mayor.name
    for entity in (*companies, *people):
        if entity.name in entities:  # names are built from distinct words; this guards the invariant
            raise RuntimeError(f"multihop world: duplicate entity name {entity.name!r}")
        entities[entity.name] = entity
    return World(entities, render_passages(rng, list(entities.values())))


# --- passages --------------------------------------------------------------------------------------


def _person_sections(rng: random.Random, person: Entity) -> list[list[tuple[str, tuple[str, ...]]]]:
    """A person's early-life and career passages as (sentence, relations it states) lists."""
    f, name = person.facts, person.name
    pronoun, possessive = person.pronoun.capitalize(), "Her" if person.pronoun == "she" else "His"
    early = [
        rng.choice((f"{name} was born in {f['born_in']} in {f['birth_year']}.",
                    f"{name} is a native of {f['born_in']}, where {person.pronoun} was born in {f['birth_year']}.")),
        rng.choice((f"{pronoun} studied at {f['studied_at']}.", f"{pronoun} is a graduate of {f['studied_at']}.")),
    ]
    early_relations = [("born_in", "birth_year"), ("studied_at",)]
    if "sibling" in f:
        early.append(f"{pronoun} has a sibling, {f['sibling']}.")
        early_relations.append(("sibling",))
    early.append(rng.choice((f"{pronoun} plays the {f['instrument']}.",
                             f"In {possessive.lower()} spare time {person.pronoun} plays the {f['instrument']}.")))
    early_relations.append(("instrument",))
    career = [
        rng.choice((f"{name} works for {f['works_for']} as {_with_article(f['occupation'])}, having joined in "
                    f"{f['joined_year']}.",
                    f"{name} has been {_with_article(f['occupation'])} at {f['works_for']} since {f['joined_year']}.")),
        rng.choice((f"{pronoun} was mentored by {f['mentor']}.", f"{possessive} mentor was {f['mentor']}.")),
    ]
    career_relations = [("works_for", "occupation", "joined_year"), ("mentor",)]
    if "spouse" in f:
        career.append(rng.choice((f"{pronoun} is married to {f['spouse']}.", f"{name} and {f['spouse']} are married.")))
        career_relations.append(("spouse",))
    return [list(zip(early, early_relations)), list(zip(career, career_relations))]


def _entity_sections(rng: random.Random, entity: Entity) -> list[list[tuple[str, tuple[str, ...]]]]:
    """The passages of one entity as (sentence, relations it states) lists."""
    f, name = entity.facts, entity.name
    if entity.kind == "person":
        return _person_sections(rng, entity)
    if entity.kind == "city":
        sentences = [
            (f"{name} is a city in {f['country']}.", ("country",)),
            (rng.choice((f"It was founded in {f['founded_year']}.", f"The city was founded in {f['founded_year']}.")),
             ("founded_year",)),
            (rng.choice((f"The mayor of {name} is {f['mayor']}.", f"{f['mayor']} serves as its mayor.")), ("mayor",)),
        ]
    elif entity.kind == "country":
        sentences = [
            (f"{name} is a country whose capital is {f['capital']}.", ("capital",)),
            (f"Its official language is {f['language']}.", ("language",)),
        ]
    elif entity.kind == "company":
        sentences = [
            (f"{name} is {_with_article(f['industry'])} company headquartered in {f['headquarters']}.",
             ("industry", "headquarters")),
            (rng.choice((f"It was founded by {f['founder']} in {f['founded_year']}.",
                         f"{f['founder']} founded the company in {f['founded_year']}.")), ("founder", "founded_year")),
        ]
    else:  # university
        sentences = [
            (f"{name} is a university located in {f['located_in']}.", ("located_in",)),
            (f"It was founded in {f['founded_year']}.", ("founded_year",)),
        ]
    return [sentences]


def render_passages(rng: random.Random, entities: list[Entity]) -> list[Passage]:
    """The corpus: Wikipedia-style passages (title = name) with ids w0, w1, ...; records fact -> passage."""
    passages: list[Passage] = []
    for entity in entities:
        for section in _entity_sections(rng, entity):
            passage_id = f"w{len(passages)}"
            passages.append(Passage(passage_id, entity.name + "\n" + " ".join(s for s, _ in section)))
            for _, relations in section:
                for relation in relations:
                    entity.fact_passage[relation] = passage_id
    return passages
