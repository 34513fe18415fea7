// Starts Apache Iceberg's REST catalog server (the RESTCatalogServer of iceberg-open-api, a JDBC
// catalog behind Iceberg's own REST adapter and servlet) on one address only. RESTCatalogServer
// listens on every interface; the local stack binds each server to 127.0.0.1.
//
// Usage: java -cp iceberg-open-api.jar:<this class> org.apache.iceberg.rest.LoopbackRestCatalog HOST PORT
// The catalog's properties come from CATALOG_* environment variables, as for RESTCatalogServer
// (CATALOG_URI=jdbc:sqlite:..., CATALOG_WAREHOUSE=s3://..., CATALOG_IO__IMPL=...);
// CATALOG_CATALOG_NAME names the catalog (a JDBC catalog lists only the tables of its name).
package org.apache.iceberg.rest;

import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public final class LoopbackRestCatalog {
  private LoopbackRestCatalog() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: LoopbackRestCatalog HOST PORT");
      System.exit(2);
    }
    Map<String, String> properties = new HashMap<>(RCKUtils.environmentCatalogConfig());
    properties.putIfAbsent(CatalogProperties.CATALOG_IMPL, JdbcCatalog.class.getName());
    properties.putIfAbsent("jdbc.schema-version", "V1");
    if (!properties.containsKey(CatalogProperties.URI)
        || !properties.containsKey(CatalogProperties.WAREHOUSE_LOCATION)) {
      System.err.println("set CATALOG_URI and CATALOG_WAREHOUSE");
      System.exit(2);
    }
    String name = properties.getOrDefault("catalog.name", "rest_backend");
    Catalog catalog = CatalogUtil.buildIcebergCatalog(name, properties, new Configuration());
    RESTCatalogAdapter adapter =
        new RESTServerCatalogAdapter(new RESTCatalogServer.CatalogContext(catalog, properties));
    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    Server server = new Server(new InetSocketAddress(args[0], Integer.parseInt(args[1])));
    server.setHandler(context);
    server.start();
    server.join();
  }
}
