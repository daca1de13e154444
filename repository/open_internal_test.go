package repository

import (
	"testing"

	"github.com/go-sql-driver/mysql"
)

// The driver options compare-and-set depends on win over whatever the DSN
// says: clientFoundRows (identical writes still match), parseTime, and
// interpolateParams (Galera loses brute-force aborts of prepared statements;
// see mysqlDSN).
func TestMySQLDSNForcesWhatCorrectnessNeeds(t *testing.T) {
	dsn, err := mysqlDSN("mysql://u:p@db:3306/clusterd?clientFoundRows=false&parseTime=false&interpolateParams=false&wsrep_sync_wait=1", 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.ClientFoundRows || !cfg.ParseTime || !cfg.InterpolateParams {
		t.Errorf("clientFoundRows %v, parseTime %v, interpolateParams %v; want all true", cfg.ClientFoundRows, cfg.ParseTime, cfg.InterpolateParams)
	}
	if cfg.Params["wsrep_sync_wait"] != "1" {
		t.Errorf("session variables of the DSN are kept: %v", cfg.Params)
	}
}
