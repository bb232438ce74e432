CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE images (
    id INTEGER PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, path TEXT, format TEXT, symbol_source TEXT, info TEXT);
CREATE TABLE configs (id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY, image INTEGER NOT NULL REFERENCES images(id), started REAL, finished REAL,
    status TEXT NOT NULL, config TEXT, versions TEXT, summary TEXT, pid INTEGER, host TEXT, scope INTEGER);
CREATE TABLE functions (
    id INTEGER PRIMARY KEY, image INTEGER NOT NULL REFERENCES images(id), start INTEGER NOT NULL,
    size INTEGER NOT NULL, name TEXT NOT NULL, section TEXT NOT NULL, bytes BLOB NOT NULL,
    config INTEGER REFERENCES configs(id));
CREATE UNIQUE INDEX functions_by_start ON functions (image, start, name);
CREATE TABLE outcomes (
    id INTEGER PRIMARY KEY, verdict TEXT NOT NULL, method TEXT NOT NULL, plan_kind TEXT NOT NULL,
    rule TEXT NOT NULL, klass TEXT NOT NULL, reason_key TEXT NOT NULL, reason TEXT NOT NULL);
CREATE UNIQUE INDEX outcomes_by_fields ON outcomes (verdict, method, plan_kind, rule, klass, reason_key);
CREATE INDEX outcomes_by_reason ON outcomes (verdict, reason_key);
CREATE TABLE counterexamples (id INTEGER PRIMARY KEY, state TEXT NOT NULL, differences TEXT NOT NULL,
    replay TEXT NOT NULL);
CREATE TABLE instructions (
    function INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL, outcome INTEGER NOT NULL,
    reason TEXT, proof_us INTEGER NOT NULL, fresh INTEGER NOT NULL, sites INTEGER, answers TEXT, cex INTEGER,
    PRIMARY KEY (function, offset)) WITHOUT ROWID;
CREATE TABLE packed (
    function INTEGER PRIMARY KEY, outcomes BLOB NOT NULL, counts BLOB NOT NULL, names BLOB, variants BLOB,
    sites BLOB, data BLOB NOT NULL);
CREATE TABLE variant_names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE variants (
    function INTEGER NOT NULL, offset INTEGER NOT NULL, name INTEGER NOT NULL, outcome INTEGER NOT NULL, reason TEXT,
    PRIMARY KEY (function, offset, name)) WITHOUT ROWID;
CREATE TABLE replacements (
    image INTEGER NOT NULL, alt INTEGER NOT NULL, site INTEGER NOT NULL, address INTEGER NOT NULL,
    bytes BLOB NOT NULL, outcome INTEGER NOT NULL, reason TEXT, proof_us INTEGER NOT NULL, fresh INTEGER NOT NULL,
    PRIMARY KEY (image, alt, address)) WITHOUT ROWID;
