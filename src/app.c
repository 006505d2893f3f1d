/* app.c - see app.h. */
#include "app.h"

struct config *app_config(struct app *a)
{
    pthread_mutex_lock(&a->cfg_mu);
    struct config *c = config_ref(a->cfg);
    pthread_mutex_unlock(&a->cfg_mu);
    return c;
}

void app_set_config(struct app *a, struct config *c)
{
    pthread_mutex_lock(&a->cfg_mu);
    struct config *old = a->cfg;
    a->cfg = c;
    pthread_mutex_unlock(&a->cfg_mu);
    if (old)
        config_unref(old);
}
