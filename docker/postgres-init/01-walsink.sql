-- The committer table's own database and role, beside Airflow's metadata database
-- (run once by the postgres image on an empty data volume).
CREATE ROLE walsink LOGIN PASSWORD 'walsink';
CREATE DATABASE walsink OWNER walsink;
